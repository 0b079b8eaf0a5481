"""`draftgen run`: the whole pipeline in one command, starting whatever is not given."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from compose.process import ManagedProcess
from compose.stack import LocalStack
from sinks.shards import ShardStore
from streams.cli.args import policy_flags, policy_from_args
from streams.core.errors import CliError
from streams.core.records import POLICY_PREFIX, is_policy_drop
from streams.core.settings import KafkaSettings, StorageSettings
from streams.core.turns import finished
from streams.ops.progress import DatasetFigures, DeadLetterReader, DeadLetterTally, dataset_figures


class RunFailed(Exception):
    pass


def bundled_tokenizer_dir() -> Path:
    import compose

    return Path(compose.__file__).parent / "assets" / "qwen36-tiny"


def _generate_flags(args: argparse.Namespace) -> list[str]:
    flags = [
        "--concurrency",
        str(args.concurrency),
        "--temperature",
        str(args.temperature),
        "--top-p",
        str(args.top_p),
        "--max-tokens",
        str(args.max_tokens),
        "--max-attempts",
        str(args.max_attempts),
        "--request-timeout",
        str(args.request_timeout),
    ]
    for flag, value in (("--seed", args.seed), ("--model", args.model), ("--family", args.family)):
        if value is not None:
            flags += [flag, str(value)]
    if args.no_thinking:
        flags.append("--no-thinking")
    return flags


def _tokenize_flags(args: argparse.Namespace) -> list[str]:
    flags = policy_flags(policy_from_args(args))
    return [*flags, "--no-drift"] if args.no_drift else flags


@dataclass
class RunResult:
    figures: DatasetFigures
    dead_letters: DeadLetterTally
    expected: int
    elapsed_s: float


async def wait_until_done(
    kafka: KafkaSettings,
    store: ShardStore,
    expected: set[str],
    workers: list[ManagedProcess],
    timeout_s: float,
    show_progress: bool = True,
) -> RunResult:
    """Until every expected prompt id is a committed sample or a dead letter."""
    started = time.monotonic()
    reader = DeadLetterReader(kafka)
    try:
        while True:
            figures = await asyncio.to_thread(dataset_figures, store)
            tally = await reader.poll()
            # every-turn conversations are done when each of their turns is
            done = len(finished(expected, figures.prompt_ids | tally.prompt_ids))
            if show_progress:
                print(
                    f"\rsamples {figures.samples}, dead letters {len(tally.prompt_ids)}, "
                    f"done {done}/{len(expected)}",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
            if done == len(expected):
                if show_progress:
                    print(file=sys.stderr)
                return RunResult(figures, tally, len(expected), time.monotonic() - started)
            for worker in workers:
                if not worker.alive():
                    raise RunFailed(f"worker {worker.name} exited; see {worker.log_path}")
            if time.monotonic() - started > timeout_s:
                raise RunFailed(f"not done after {timeout_s:.0f}s: {done}/{len(expected)} prompts")
            await asyncio.sleep(1.0)
    finally:
        await reader.close()


def run_pipeline(args: argparse.Namespace) -> int:
    from producers.publish import publish
    from producers.sources import bundled_sample_path, parse_source_spec
    from streams.tokenize.loading import load_tokenizer

    workdir = Path(args.workdir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out = args.out or str(workdir / "out")
    tokenizer = str(args.tokenizer or bundled_tokenizer_dir())
    load_tokenizer(tokenizer)  # refuse to start on a bad tokenizer directory, before any service
    try:
        specs = [parse_source_spec(s) for s in (args.sources or [str(bundled_sample_path())])]
    except ValueError as err:
        raise CliError(str(err)) from None
    storage = StorageSettings.from_env(out)
    stack = LocalStack(workdir)
    try:
        bootstrap = args.bootstrap or stack.start_kafka()
        servers = args.server or [
            stack.start_emulator(
                tokenizer,
                "--tokens-per-s",
                str(args.emulator_tokens_per_s),
                "--seed",
                str(index),
                name=f"emulator-{index}",
            )
            for index in range(args.servers)
        ]
        kafka = KafkaSettings.from_env(bootstrap, args.topic_prefix, args.partitions)
        summary = asyncio.run(
            publish(kafka, specs, args.limit, storage.storage_options(), regen=args.regen)
        )
        print(summary.line())
        common = [
            "--bootstrap",
            bootstrap,
            "--topic-prefix",
            args.topic_prefix,
            "--partitions",
            str(args.partitions),
        ]
        log_level = ["--log-level", args.log_level]
        workers = [
            stack.start_worker(
                f"generate-{index}",
                [
                    *log_level,
                    "worker",
                    "generate",
                    "--server",
                    server,
                    *common,
                    *_generate_flags(args),
                ],
            )
            for index, server in enumerate(servers)
        ]
        workers.append(
            stack.start_worker(
                "tokenize",
                [
                    *log_level,
                    "worker",
                    "tokenize",
                    "--tokenizer",
                    tokenizer,
                    "--out",
                    out,
                    "--dataset",
                    args.dataset,
                    "--idle-flush",
                    "2",
                    *_tokenize_flags(args),
                    *common,
                ],
            )
        )
        store = ShardStore(out, args.dataset, storage.storage_options())
        try:
            result = asyncio.run(
                wait_until_done(
                    kafka,
                    store,
                    set(summary.prompt_ids),
                    workers,
                    args.timeout,
                    show_progress=sys.stderr.isatty(),
                )
            )
        except RunFailed as err:
            raise CliError(str(err)) from None
    finally:
        stack.stop_all()
    print_summary(result, store.url, workdir)
    return 0


def print_summary(result: RunResult, dataset_url: str, workdir: Path) -> None:
    figures, tally = result.figures, result.dead_letters
    print(f"done in {result.elapsed_s:.1f}s: {result.expected} prompts")
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
    else:
        print("  drift        not measured (no sample with server ids was compared)")
    if figures.truncated:
        print(f"  truncated    {figures.truncated} samples cut to --max-seq-len")
    policy = sorted((k, n) for k, n in tally.by_reason.items() if is_policy_drop(k[1]))
    print(f"  policy drops {len(tally.policy_ids)} (dropped by the sample policy, not failures)")
    for (_, kind), count in policy:
        print(f"    {kind.removeprefix(POLICY_PREFIX)}: {count}")
    print(f"  dead letters {len(tally.prompt_ids - tally.policy_ids)}")
    for (stage, kind), count in sorted(tally.by_reason.items()):
        if not is_policy_drop(kind):
            print(f"    {stage}/{kind}: {count}")
    print(f"  logs         {workdir / 'logs'}")
