"""`draftgen run`: the whole pipeline in one command, starting whatever is not given."""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from sinks.shards import ShardStore
from streams.cli.flags import add_flags, build
from streams.cli.publish import cleaner_of, recipe_sources
from streams.cli.resume import RUNS_DIR, RunRecord, choose_workdir, command_of, resume_hint
from streams.cli.run_summary import draftgen_command, print_audit, print_next_steps, print_summary
from streams.cli.run_wait import RunFailed, RunResult, wait_until_done
from streams.core.errors import CliError
from streams.core.outage import short_error
from streams.core.settings import (
    GenerateSettings,
    KafkaSettings,
    ObserveSettings,
    OnceSettings,
    PublishSettings,
    RunSettings,
    StorageSettings,
    TokenizeSettings,
    current_stack,
    secrets_removed,
)
from streams.core.settings.names import tokenize_group_name
from streams.core.turns import finished
from streams.tools.audit import AuditResult, audit
from streams.tools.progress import dataset_figures

if TYPE_CHECKING:  # compose is imported when `run` runs, not when the parser is built
    from compose.process import ManagedProcess
    from compose.stack import LocalStack
    from producers.publish import PublishSummary
    from streams.core.stack_state import StackState


def bundled_tokenizer_dir() -> Path:
    import compose

    return Path(compose.__file__).parent / "assets" / "qwen36-tiny"


# what `run` lets the user set of its tokenize worker (the rest is decided by `run`)
TOKENIZE_FLAGS = ("measure_drift", "policy")
# a run stops its workers (Ctrl-C) with 10 s before SIGKILL: each finishes what ends within
# this, writes the outcome of every answer it has (streams/generate/record.py) and releases the
# rest, well inside those 10 s; a SIGKILL mid-record would have the prompt generated again
RUN_DRAIN_S = 3.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sources", nargs="*", help="prompt sources (default: the bundled samples)")
    add_flags(parser, RunSettings)
    add_flags(parser, KafkaSettings)
    add_flags(
        parser,
        PublishSettings,
        only=[
            "limit",
            "regen",
            "id_field",
            "recipe",
            "source_recipe",
            "dedup_text",
            "decontaminate",
            "contamination_ngram",
            "near_duplicates",
        ],
    )
    # `run`'s own --tokenizer-dir serves both stages
    add_flags(parser, GenerateSettings, skip=["server", "kafka", "instance_id", "tokenizer_dir"])
    add_flags(parser, TokenizeSettings, only=TOKENIZE_FLAGS)
    parser.set_defaults(handler=run_pipeline)


def worker_env(workdir: Path) -> dict[str, str]:
    """The environment a worker of the run starts with, beyond the run's own: its temporary
    files (faust's datadir) under the workdir, so a killed worker leaves nothing in /tmp."""
    tmp = workdir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)  # tempfile ignores a TMPDIR that does not exist
    return {"TMPDIR": str(tmp)}


def write_settings(workdir: Path, name: str, **sections: Any) -> Path:
    """A worker's settings as a file it is started with (`--settings`); secrets stay in the
    environment the worker inherits."""
    path = workdir / "settings" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    values = {key: secrets_removed(value) for key, value in sections.items()}
    path.write_bytes(orjson.dumps(values, option=orjson.OPT_INDENT_2))
    return path


def tokenize_group(existing: dict[str, Any] | None, kafka: KafkaSettings, dataset: str) -> str:
    """The consumer group of the run's tokenize workers: the version's own when it exists (they
    resume it), else a new one, read from the topic's first offset. Not the one named after the
    dataset alone: a run of the same name into another --out may have read past the stored
    completions of the prompts generated before."""
    if existing is not None:
        group = existing.get("consumer_group") or kafka.group(tokenize_group_name(dataset))
        return str(group).removeprefix(kafka.topic_prefix)
    return tokenize_group_name(dataset, secrets.token_hex(4))


def not_built_before(
    existing: dict[str, Any] | None,
    store: ShardStore,
    before: list[str],
    earlier: set[str] | None = None,
) -> str | None:
    """Why the run cannot finish, if so: prompts generated before but missing from a version
    that exists, whose group may have read past their completions. Not those of `earlier`, the
    prompts the version's workers were given before (a resumed run): the group kept them."""
    if existing is None or not before:
        return None
    missing = set(before) - finished(before, dataset_figures(store).prompt_ids) - (earlier or set())
    if not missing:
        return None
    return (
        f"{len(missing)} prompts were generated before but are not in the existing dataset "
        f"version {store.url}, whose tokenize group may have read past their completions: "
        "build a new version (another --dataset or --out)"
    )


def run_pipeline(args: argparse.Namespace) -> int:
    """`draftgen run`; an unfinished run of the same command is resumed (streams/cli/resume.py)."""
    settings = build(RunSettings, args)
    publishing = build(PublishSettings, args)
    command = command_of(args)
    workdir, resumed = choose_workdir(
        settings.workdir, command, RUNS_DIR / time.strftime("%Y%m%d-%H%M%S")
    )
    try:
        return _run(args, settings, publishing, workdir, RunRecord(command), resumed)
    except KeyboardInterrupt:
        print(f"draftgen run: {resume_hint(draftgen_command())}", file=sys.stderr)
        raise


@dataclass
class _Plan:
    """What a run was given, checked before any service starts."""

    args: argparse.Namespace
    settings: RunSettings
    publishing: PublishSettings
    workdir: Path
    resumed: bool
    out: str
    tokenizer: str
    recipe: str
    specs: list[Any]
    storage: StorageSettings
    store: ShardStore
    existing: dict[str, Any] | None  # the version's manifest, when it exists

    @property
    def prompts_file(self) -> Path:
        """The run's prompt ids: the version holds exactly these."""
        return self.workdir / "settings" / "prompts.json"


def _run(
    args: argparse.Namespace,
    settings: RunSettings,
    publishing: PublishSettings,
    workdir: Path,
    record: RunRecord,
    resumed: bool,
) -> int:
    from compose.stack import LocalStack

    plan = _plan(args, settings, publishing, workdir, resumed)
    # a running local stack (`draftgen stack up`) outlives the run: its broker keeps what
    # `status`, `dead-letters`, `replay` and `seal` read afterwards
    local = None if getattr(args, "bootstrap", None) else current_stack()
    record.write(workdir)  # from here on, the same command resumes this run
    with LocalStack(workdir, forked=settings.fork) as stack:  # stops it all, also on Ctrl-C
        bootstrap, servers = _start_services(plan, stack, local)
        kafka = build(KafkaSettings, args, bootstrap=bootstrap)
        summary = _publish(plan, kafka)
        prompts = _version_prompts(plan, summary)
        workers = _start_workers(plan, stack, kafka, servers)
        result, audited = _wait(plan, kafka, prompts, workers)
    print_summary(result, plan.store.url, workdir, before=len(set(summary.generated_ids)))
    print_audit(audited, kafka)
    print_next_steps(
        out=plan.out,
        dataset=settings.dataset,
        tokenizer=plan.tokenizer,
        broker=None if local else bootstrap,
        broker_kept=local is not None or bool(getattr(args, "bootstrap", None)),
        topic_prefix=kafka.topic_prefix,
    )
    record.finished = True
    record.write(workdir)  # the same command now starts a new run
    return 0 if audited.missing == audited.pending else 1  # 1: a prompt lost


def _plan(
    args: argparse.Namespace,
    settings: RunSettings,
    publishing: PublishSettings,
    workdir: Path,
    resumed: bool,
) -> _Plan:
    """The run's inputs and its version; a bad tokenizer directory, recipe or --out is refused
    here, before any service starts."""
    from streams.core.tokenizers import load_tokenizer

    out = settings.out or str(workdir / "out")
    tokenizer = str(settings.tokenizer_dir or bundled_tokenizer_dir())
    family = load_tokenizer(tokenizer).profile
    recipe, specs = recipe_sources(args.sources, publishing, family.thinking_kwarg)
    storage = StorageSettings(out=out)
    try:
        store = ShardStore(out, settings.dataset, storage.storage_options())
        existing = store.manifest()
    except Exception as err:
        raise CliError(f"cannot read {out}: {short_error(err)}") from None
    return _Plan(
        args=args,
        settings=settings,
        publishing=publishing,
        workdir=workdir,
        resumed=resumed,
        out=out,
        tokenizer=tokenizer,
        recipe=recipe,
        specs=specs,
        storage=storage,
        store=store,
        existing=existing,
    )


def _start_services(
    plan: _Plan, stack: LocalStack, local: StackState | None
) -> tuple[str, list[str]]:
    """The broker (`--bootstrap`, the local stack's, else one started for the run) and the
    servers (`--server`, else emulated ones)."""
    from compose import zygote

    settings = plan.settings
    if settings.fork:
        zygote.start_in_background()  # imports the workers' modules while Kafka starts
    bootstrap = getattr(plan.args, "bootstrap", None) or (
        local.bootstrap if local else stack.start_kafka()
    )
    servers = settings.servers or [
        stack.start_emulator(
            plan.tokenizer,
            "--tokens-per-s",
            str(settings.emulator_tokens_per_s),
            "--seed",
            str(index),
            name=f"emulator-{index}",
            kind=settings.emulate,
        )
        for index in range(settings.emulated_servers)
    ]
    return bootstrap, servers


def _publish(plan: _Plan, kafka: KafkaSettings) -> PublishSummary:
    from producers.publish import publish

    publishing, storage = plan.publishing, plan.storage
    summary = asyncio.run(
        publish(
            kafka,
            plan.specs,
            publishing.limit,
            storage.storage_options(),
            regen=publishing.regen,
            id_field=publishing.id_field,
            cleaner=cleaner_of(publishing, storage.storage_options()),
            skip_published=plan.resumed,
            recipe_name=plan.recipe,
        )
    )
    print(summary.line())
    return summary


def _version_prompts(plan: _Plan, summary: PublishSummary) -> set[str]:
    """The prompts the version is to hold, written where its tokenize workers read them;
    refused when an existing version cannot be built of them."""
    prompts_file = plan.prompts_file
    # a resumed run's version was filtered by the same prompts: its group read past none
    earlier = set(orjson.loads(prompts_file.read_bytes())) if prompts_file.exists() else set()
    if refused := not_built_before(plan.existing, plan.store, summary.generated_ids, earlier):
        raise CliError(refused)
    # the version holds exactly the run's prompts: those generated now, those on the topic
    # waiting (a resumed run's), and those generated before, built from their stored
    # completions
    prompts = {*summary.prompt_ids, *summary.pending_ids, *summary.generated_ids}
    if plan.resumed:
        print(
            f"draftgen run: resuming dataset {plan.settings.dataset} in {plan.out}: "
            f"{len(set(summary.generated_ids))} of {len(prompts)} prompts generated, "
            f"{len(prompts) - len(set(summary.generated_ids))} to go",
            file=sys.stderr,
        )
    prompts_file.parent.mkdir(parents=True, exist_ok=True)
    prompts_file.write_bytes(orjson.dumps(sorted(prompts)))
    return prompts


def run_model(servers: list[GenerateSettings]) -> dict[str, Any]:
    """The run's model, which each generate worker checks its server's against at start (one
    model per run: streams/generate/identity.py): the one `--expect-model` names, else the one
    the first server that answers serves. None answering now: nothing expected (each worker
    then waits for its own server, and its console says it is down, as before)."""
    if not servers or servers[0].expect_model is not None:
        return {}
    from streams.generate.client import ask_served_model

    model = None
    for settings in servers:
        try:
            model = asyncio.run(ask_served_model(settings))
            break
        except Exception:  # down or starting: the next one, else nothing expected
            continue
    if model is None:
        return {}
    return {
        "expect_model": model.name,
        "expect_revision": model.revision,
        "expect_tokenizer": model.tokenizer,
    }


def _start_workers(
    plan: _Plan, stack: LocalStack, kafka: KafkaSettings, servers: list[str]
) -> list[ManagedProcess]:
    """A generate worker per server, then the tokenize workers, each started with its settings
    file."""
    args, settings, workdir, tokenizer = plan.args, plan.settings, plan.workdir, plan.tokenizer

    def start(name: str, stage: str, path: Path) -> ManagedProcess:
        argv = ["--log-level", args.log_level, "worker", stage, "--settings", str(path)]
        return stack.start_worker(name, argv, env=worker_env(workdir))

    workers = []
    expected = run_model(
        [
            build(GenerateSettings, args, server=s, kafka=kafka, tokenizer_dir=tokenizer)
            for s in servers
        ]
    )
    for index, server in enumerate(servers):
        name = f"generate-{index}"
        generate = build(
            GenerateSettings,
            args,
            server=server,
            kafka=kafka,
            tokenizer_dir=tokenizer,
            **expected,
        )
        generate = generate.model_copy(update={"drain_s": min(generate.drain_s, RUN_DRAIN_S)})
        path = write_settings(workdir, name, generate=generate, once=OnceSettings())
        workers.append(start(name, "generate", path))
    tokenize = build(
        TokenizeSettings,
        args,
        only=TOKENIZE_FLAGS,
        tokenizer_dir=tokenizer,
        dataset=settings.dataset,
        storage=plan.storage,
        kafka=kafka,
        idle_flush_s=settings.idle_flush_s,
        group_id=tokenize_group(plan.existing, kafka, settings.dataset),
        prompts_file=str(plan.prompts_file),
    )
    path = write_settings(workdir, "tokenize", tokenize=tokenize, observe=ObserveSettings())
    for index in range(settings.tokenize_workers):
        workers.append(start(f"tokenize-{index}", "tokenize", path))
    return workers


def _wait(
    plan: _Plan, kafka: KafkaSettings, prompts: set[str], workers: list[ManagedProcess]
) -> tuple[RunResult, AuditResult]:
    """Until every prompt of the run has its outcome, then the audit of them."""
    try:
        result = asyncio.run(
            wait_until_done(kafka, plan.store, prompts, workers, plan.settings.timeout_s)
        )
        # from the topics, not from the workers' counts: every prompt of this run published
        # has an outcome
        audited = asyncio.run(audit(kafka, progress=sys.stderr.isatty(), only=prompts))
    except RunFailed as err:
        raise CliError(str(err)) from None
    return result, audited
