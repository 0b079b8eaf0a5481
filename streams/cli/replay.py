"""`draftgen replay`: a new dataset version built from the `completions` topic, nothing generated.

A replay is a tokenize worker with a dataset version of its own, hence a consumer group of its
own (`draftgen-tokenize-{dataset}`) that starts at the topic's first offset, typically with a
fixed chat template or tokenizer. It catches up on every completion stored when it started,
showing its progress, and ends (`--follow`: keeps following new ones, while generation may
still be running). Earlier versions live under other dataset names and are never touched:
replay refuses a name that a tokenize worker already built (a restarted replay of the same name
resumes its own group).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streams.cli.flags import add_flags, build, settings_file
from streams.cli.worker import add_tokenize_flags, run_tokenize
from streams.core.errors import CliError
from streams.core.meter import Meter
from streams.core.settings import COMPLETIONS, ObserveSettings, ReplaySettings, TokenizeSettings
from streams.tools.progress import GroupProgress, dataset_figures

if TYPE_CHECKING:
    from compose.process import ManagedProcess
    from sinks.shards import ShardStore

REPLAY_MANIFEST = {"replay": True, "replay_from": "completions@earliest"}
# how often the supervisor looks at the group's offsets and its workers
POLL_S = 1.0


def refusal(existing: dict[str, Any] | None, dataset: str) -> str | None:
    """A replay writes a version of its own: never into one built by a tokenize worker."""
    if existing is not None and not existing.get("replay"):
        return (
            f"dataset version {dataset!r} already exists and was not built by a replay; "
            "replay builds a new version: pick another --dataset"
        )
    return None


def check(existing: dict[str, Any] | None, settings: TokenizeSettings) -> dict[str, Any]:
    refused = refusal(existing, settings.dataset)
    if refused:
        raise CliError(refused)
    return REPLAY_MANIFEST


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tokenize_flags(parser)
    add_flags(parser, ReplaySettings)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    replay = build(ReplaySettings, args)
    if replay.follow and replay.workers == 1:
        return run_tokenize(args, check)  # the worker itself, in this process, for good
    return run_workers(args, replay)


def run_workers(args: argparse.Namespace, replay: ReplaySettings) -> int:
    """The replay's workers as child processes of this one (each following), watched from here:
    until the version has caught up (unless --follow), or one of them fails, or we are stopped."""
    from compose.stack import LocalStack
    from sinks.shards import ShardStore
    from streams.cli.run import write_settings

    file = settings_file(args)
    settings = build(TokenizeSettings, args, base=file.get("tokenize"))
    observe = build(ObserveSettings, args, base=file.get("observe"))
    if observe.metrics_port:  # one port cannot serve N workers: each takes a free one
        observe = observe.model_copy(update={"metrics_port": 0})
    store = ShardStore(settings.storage.out, settings.dataset, settings.storage.storage_options())
    check(store.manifest(), settings)  # refuse before starting anything
    workdir = Path(replay.workdir or Path("runs") / time.strftime("replay-%Y%m%d-%H%M%S"))
    path = write_settings(workdir.resolve(), "replay", tokenize=settings, observe=observe)
    argv = ["--log-level", args.log_level, "replay", "--settings", str(path), "--follow"]
    with LocalStack(workdir.resolve()) as stack:  # stops what it started, also on Ctrl-C
        workers = [stack.start_worker(f"replay-{i}", argv) for i in range(replay.workers)]
        print(
            f"draftgen replay: {replay.workers} worker{'s' * (replay.workers > 1)} on "
            f"{settings.dataset}; logs in {workdir / 'logs'}",
            file=sys.stderr,
        )
        asyncio.run(watch(settings, store, workers, follow=replay.follow))
    return 0


async def watch(
    settings: TokenizeSettings, store: ShardStore, workers: list[ManagedProcess], follow: bool
) -> None:
    """The version's progress through the completions stored at start, until it has them all
    (or, following, until stopped); a worker that exits fails the replay."""
    progress = GroupProgress(settings.kafka, settings.consumer_group, COMPLETIONS)
    await progress.start()
    total = progress.total  # the completions stored now: what the version must hold to end
    meter = Meter(f"replay {settings.dataset}", "completion", total)
    try:
        while True:
            for worker in workers:
                if not worker.alive():
                    meter.close()
                    raise CliError(f"worker {worker.name} exited; see {worker.log_path}")
            done = await progress.done()
            meter.update(done)
            if done >= total and not follow:
                break
            await asyncio.sleep(POLL_S)
    finally:
        await progress.close()
    figures = await asyncio.to_thread(dataset_figures, store, keep_ids=False)
    meter.close(
        f"draftgen replay: caught up: {total:,} completions read, {figures.samples:,} "
        f"samples in {figures.shards:,} shards of {store.url}"
    )
