"""`draftgen run`: the whole pipeline in one command, starting whatever is not given."""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import sys
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from sinks.shards import ShardStore
from streams.cli.flags import add_flags, build
from streams.cli.publish import cleaner_of, recipe_sources
from streams.cli.resume import RUNS_DIR, RunRecord, choose_workdir, command_of, resume_hint
from streams.core.errors import CliError
from streams.core.meter import Meter
from streams.core.outage import short_error
from streams.core.records import POLICY_PREFIX, is_policy_drop
from streams.core.retry import backoff, until_done
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
from streams.core.turns import finished
from streams.tools.audit import audit, republish_command
from streams.tools.console import RunConsole
from streams.tools.progress import (
    DatasetFigures,
    DeadLetterReader,
    DeadLetterTally,
    dataset_figures,
)

if TYPE_CHECKING:  # compose is imported when `run` runs, not when the parser is built
    from compose.process import ManagedProcess


class RunFailed(Exception):
    pass


def bundled_tokenizer_dir() -> Path:
    import compose

    return Path(compose.__file__).parent / "assets" / "qwen36-tiny"


log = logging.getLogger(__name__)
# polling progress: retried quickly, the run's timeout bounds it
STORAGE_BACKOFF = backoff("poll")


@dataclass
class RunResult:
    figures: DatasetFigures
    dead_letters: DeadLetterTally
    prompt_ids: set[str]  # the run's
    elapsed_s: float

    @property
    def expected(self) -> int:
        return len(self.prompt_ids)


async def wait_until_done(
    kafka: KafkaSettings,
    store: ShardStore,
    expected: set[str],
    workers: list[ManagedProcess],
    timeout_s: float,
    show_progress: bool = True,
) -> RunResult:
    """Until every expected prompt id has its outcome: a committed sample or a recorded drop of
    the dataset version, or a dead letter of the publish or generate stage."""
    started = time.monotonic()
    reader = DeadLetterReader(kafka)
    # a bar on a terminal, a plain line every few seconds in a log (streams/core/meter.py)
    meter = Meter("run", "prompt", len(expected)) if show_progress else None
    console = RunConsole(kafka, partial(_say, meter))
    try:
        while True:
            # storage may be down or just back (a restarted S3 answers 500 for a moment): the
            # workers wait that out, and so does the wait for them, within the run's timeout
            reading = until_done(
                "reading the dataset's progress",
                lambda: asyncio.to_thread(dataset_figures, store),
                STORAGE_BACKOFF,
                log,
            )
            remaining = timeout_s - (time.monotonic() - started)
            try:
                figures = await asyncio.wait_for(reading, timeout=max(remaining, 1.0))
            except TimeoutError:
                raise RunFailed(f"not done after {timeout_s:.0f}s: storage unreadable") from None
            tally = await reader.poll()
            await console.poll()
            upstream = tally.ids_before(TOKENIZE_STAGE)
            # every-turn conversations are done when each of their turns is
            done = len(finished(expected, figures.prompt_ids | upstream))
            if meter is not None:
                meter.update(done)
            if done == len(expected):
                if meter is not None:
                    meter.close(
                        f"run: {done:,} prompts done: {figures.samples:,} samples, "
                        f"{len(figures.drops) + len(upstream):,} dropped"
                    )
                return RunResult(figures, tally, set(expected), time.monotonic() - started)
            for worker in workers:
                if not worker.alive():
                    raise RunFailed(exit_line(worker))
            if time.monotonic() - started > timeout_s:
                raise RunFailed(f"not done after {timeout_s:.0f}s: {done}/{len(expected)} prompts")
            await asyncio.sleep(1.0)
    finally:
        await reader.close()
        await console.close()


def _say(meter: Meter | None, line: str) -> None:
    """A console line of the run; above the progress bar when there is one."""
    line = f"draftgen run: {line}"
    if meter is not None:
        meter.say(line)
    else:
        print(line, file=sys.stderr, flush=True)


# what a worker's log says when it fails: the last such line is why it exited
_FAILURE_LEVELS = (" ERROR ", " CRITICAL ", "error:")


def exit_line(worker: ManagedProcess) -> str:
    """Which worker exited, with what status and why (its last error line), and its log."""
    code = worker.popen.returncode if worker.popen is not None else None
    why = next(
        (
            line.strip()
            for line in reversed(worker.tail(200).splitlines())
            if any(level in line for level in _FAILURE_LEVELS)
        ),
        "",
    )
    return (
        f"worker {worker.name} exited with status {code}"
        + (f": {why[:300]}" if why else "")
        + f"; see {worker.log_path}"
    )


TOKENIZE_STAGE = "tokenize"
# what `run` lets the user set of its tokenize worker (the rest is decided by `run`)
TOKENIZE_FLAGS = ("measure_drift", "policy")


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
        group = existing.get("consumer_group") or kafka.group(f"draftgen-tokenize-{dataset}")
        return str(group).removeprefix(kafka.topic_prefix)
    # 100 characters at most (a SafeName)
    return f"draftgen-tokenize-{dataset[:73]}-{secrets.token_hex(4)}"


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


def _run(
    args: argparse.Namespace,
    settings: RunSettings,
    publishing: PublishSettings,
    workdir: Path,
    record: RunRecord,
    resumed: bool,
) -> int:
    from compose import zygote
    from compose.stack import LocalStack
    from producers.publish import publish
    from streams.core.tokenizers import load_tokenizer

    out = settings.out or str(workdir / "out")
    tokenizer = str(settings.tokenizer_dir or bundled_tokenizer_dir())
    # refuse to start on a bad tokenizer directory or recipe, before any service
    family = load_tokenizer(tokenizer).profile
    recipe, specs = recipe_sources(args.sources, publishing, family.thinking_kwarg)
    storage = StorageSettings(out=out)
    try:
        store = ShardStore(out, settings.dataset, storage.storage_options())
        existing = store.manifest()
    except Exception as err:
        raise CliError(f"cannot read {out}: {short_error(err)}") from None
    # a running local stack (`draftgen stack up`) outlives the run: its broker keeps what
    # `status`, `dead-letters`, `replay` and `seal` read afterwards
    local = None if getattr(args, "bootstrap", None) else current_stack()
    record.write(workdir)  # from here on, the same command resumes this run
    with LocalStack(workdir, forked=settings.fork) as stack:  # stops it all, also on Ctrl-C
        if settings.fork:
            zygote.start_in_background()  # imports the workers' modules while Kafka starts
        bootstrap = getattr(args, "bootstrap", None) or (
            local.bootstrap if local else stack.start_kafka()
        )
        servers = settings.servers or [
            stack.start_emulator(
                tokenizer,
                "--tokens-per-s",
                str(settings.emulator_tokens_per_s),
                "--seed",
                str(index),
                name=f"emulator-{index}",
                kind=settings.emulate,
            )
            for index in range(settings.emulated_servers)
        ]
        kafka = build(KafkaSettings, args, bootstrap=bootstrap)
        summary = asyncio.run(
            publish(
                kafka,
                specs,
                publishing.limit,
                storage.storage_options(),
                regen=publishing.regen,
                id_field=publishing.id_field,
                cleaner=cleaner_of(publishing, storage.storage_options()),
                skip_published=resumed,
                recipe_name=recipe,
            )
        )
        print(summary.line())
        prompts_file = workdir / "settings" / "prompts.json"
        # a resumed run's version was filtered by the same prompts: its group read past none
        earlier = set(orjson.loads(prompts_file.read_bytes())) if prompts_file.exists() else set()
        if refused := not_built_before(existing, store, summary.generated_ids, earlier):
            raise CliError(refused)
        # the version holds exactly the run's prompts: those generated now, those on the topic
        # waiting (a resumed run's), and those generated before, built from their stored
        # completions
        prompts = {*summary.prompt_ids, *summary.pending_ids, *summary.generated_ids}
        if resumed:
            print(
                f"draftgen run: resuming dataset {settings.dataset} in {out}: "
                f"{len(set(summary.generated_ids))} of {len(prompts)} prompts generated, "
                f"{len(prompts) - len(set(summary.generated_ids))} to go",
                file=sys.stderr,
            )
        prompts_file.parent.mkdir(parents=True, exist_ok=True)
        prompts_file.write_bytes(orjson.dumps(sorted(prompts)))

        def start(name: str, stage: str, path: Path) -> ManagedProcess:
            argv = ["--log-level", args.log_level, "worker", stage, "--settings", str(path)]
            return stack.start_worker(name, argv, env=worker_env(workdir))

        workers = []
        for index, server in enumerate(servers):
            name = f"generate-{index}"
            generate = build(
                GenerateSettings, args, server=server, kafka=kafka, tokenizer_dir=tokenizer
            )
            path = write_settings(workdir, name, generate=generate, once=OnceSettings())
            workers.append(start(name, "generate", path))
        tokenize = build(
            TokenizeSettings,
            args,
            only=TOKENIZE_FLAGS,
            tokenizer_dir=tokenizer,
            dataset=settings.dataset,
            storage=storage,
            kafka=kafka,
            idle_flush_s=settings.idle_flush_s,
            group_id=tokenize_group(existing, kafka, settings.dataset),
            prompts_file=str(prompts_file),
        )
        path = write_settings(workdir, "tokenize", tokenize=tokenize, observe=ObserveSettings())
        for index in range(settings.tokenize_workers):
            workers.append(start(f"tokenize-{index}", "tokenize", path))
        try:
            result = asyncio.run(
                wait_until_done(
                    kafka,
                    store,
                    prompts,
                    workers,
                    settings.timeout_s,
                )
            )
            # from the topics, not from the workers' counts: every prompt of this run published
            # has an outcome
            audited = asyncio.run(audit(kafka, progress=sys.stderr.isatty(), only=prompts))
        except RunFailed as err:
            raise CliError(str(err)) from None
    print_summary(result, store.url, workdir, before=len(set(summary.generated_ids)))
    first, *rest = audited.lines(republish_command(draftgen_command(), kafka))
    print(f"  audit        {first}")
    for line in rest:
        print(f"    {line}")
    print_next_steps(
        out=out,
        dataset=settings.dataset,
        tokenizer=tokenizer,
        broker=None if local else bootstrap,
        broker_kept=local is not None or bool(getattr(args, "bootstrap", None)),
        topic_prefix=kafka.topic_prefix,
    )
    record.finished = True
    record.write(workdir)  # the same command now starts a new run
    return 0 if audited.missing == audited.pending else 1  # 1: a prompt lost


def draftgen_command() -> list[str]:
    """How to call this draftgen again: the venv's script beside this interpreter, else the
    interpreter with `-m streams` (either works from any directory)."""
    script = Path(sys.executable).parent / "draftgen"
    return [str(script)] if script.exists() else [sys.executable, "-m", "streams"]


def print_next_steps(
    *,
    out: str,
    dataset: str,
    tokenizer: str,
    broker: str | None,
    broker_kept: bool,
    topic_prefix: str = "",
) -> None:
    """What to do next, as commands that work as printed (from any directory)."""
    import shlex

    def command(*words: str, needs_broker: bool = False) -> str:
        extra: list[str] = []
        if needs_broker and broker:
            extra += ["--bootstrap", broker]
        if needs_broker and topic_prefix:
            extra += ["--topic-prefix", topic_prefix]
        return shlex.join([*draftgen_command(), *words, *extra])

    where = ["--out", out, "--dataset", dataset]
    print("next:")
    print(f"  look at the data:  {command('report', *where, needs_broker=broker_kept)}")
    export = [*where, "--format", "specforge", "--to", f"{dataset}.jsonl"]
    print(f"  export it:         {command('export', *export)}")
    if not broker_kept:
        up = shlex.join([*draftgen_command(), "stack", "up"])
        print(
            "  the broker stopped with this run: to keep it for status, dead-letters, replay "
            f"and seal, start a local stack first ({up}) and run again"
        )
        return
    print(f"  where it stands:   {command('status', '--out', out, needs_broker=True)}")
    print(f"  failed prompts:    {command('dead-letters', needs_broker=True)}")
    replay = ["--out", out, "--dataset", f"{dataset}-v2", "--tokenizer-dir", tokenizer]
    print(
        f"  rebuild (replay):  {command('replay', *replay, needs_broker=True)}"
        "   (add --chat-template-file FILE; it ends once caught up, --follow keeps following)"
    )
    print(f"  seal the version:  {command('seal', *where, needs_broker=True)}")
    if broker is None:
        print(f"  when done:         {shlex.join([*draftgen_command(), 'stack', 'down'])}")


# the drift causes the summary names: the top few say what to fix first
SUMMARY_CAUSES = 5


def print_summary(result: RunResult, dataset_url: str, workdir: Path, before: int = 0) -> None:
    """`before`: how many of the prompts were generated before (their stored completions built)."""
    figures, tally = result.figures, result.dead_letters
    print(f"done in {result.elapsed_s:.1f}s: {result.expected} prompts")
    print(
        f"  prompts      {result.expected - before} generated now, {before} from before "
        "(built from their stored completions)"
    )
    print(f"  samples      {figures.samples}")
    print(f"  tokens       {figures.tokens}")
    print(f"  loss tokens  {figures.loss_tokens}")
    print(f"  shards       {figures.shards} in {dataset_url}")
    if figures.compared:
        share = figures.drifted / figures.compared
        print(
            f"  drift        {figures.drifted} of {figures.compared} compared samples "
            f"({share:.1%}) differ from the template's rendering"
        )
        for cause, count in figures.drift_causes.most_common(SUMMARY_CAUSES):
            print(f"    {cause}: {count}")
    else:
        print("  drift        not measured (no sample with server ids was compared)")
    if figures.truncated:
        print(f"  truncated    {figures.truncated} samples cut to --max-seq-len")
    if figures.replaced:
        print(f"  replaced     {figures.replaced} earlier answers (latest answer wins)")
    # this version's drops are its markers' (once each); earlier stages' are dead letters
    drops = Counter(figures.drops.values())
    policy = sorted((k, n) for k, n in drops.items() if is_policy_drop(k))
    dropped = sum(n for _, n in policy)
    print(f"  policy drops {dropped} (by the sample policy, not failures)")
    for kind, count in policy:
        print(f"    {kind.removeprefix(POLICY_PREFIX)}: {count}")
    # this run's prompts' letters only; a kept stack's other runs' are one line at most
    mine = tally.reasons_of(result.prompt_ids)
    upstream = {k: n for k, n in mine.items() if k[0] != TOKENIZE_STAGE}
    errors = {(TOKENIZE_STAGE, k): n for k, n in drops.items() if not is_policy_drop(k)}
    failed = len(tally.ids_before(TOKENIZE_STAGE) & result.prompt_ids) + sum(errors.values())
    print(f"  dead letters {failed}")
    for (stage, kind), count in sorted({**upstream, **errors}.items()):
        print(f"    {stage}/{kind}: {count}")
    if others := len(tally.prompt_ids - result.prompt_ids):
        print(f"  (and {others} prompts of other runs on this stack: draftgen dead-letters)")
    print(f"  logs         {workdir / 'logs'}")
