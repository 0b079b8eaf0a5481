"""`draftgen replay`: a new dataset version built from the `completions` topic, nothing generated.

A replay is a tokenize worker with a dataset version of its own, hence a consumer group of its
own (`draftgen-tokenize-{dataset}`) that starts at the topic's first offset, typically with a
fixed chat template or tokenizer. It catches up on every completion stored so far and then
keeps following new ones, while generation may still be running. Earlier versions live under
other dataset names and are never touched: replay refuses a name that a tokenize worker
already built (a restarted replay of the same name resumes its own group).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from streams.cli.flags import add_flags, build, settings_file
from streams.cli.worker import add_tokenize_flags, run_tokenize
from streams.core.errors import CliError
from streams.core.settings import ObserveSettings, ReplaySettings, TokenizeSettings

REPLAY_MANIFEST = {"replay": True, "replay_from": "completions@earliest"}


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
    if replay.workers == 1:
        return run_tokenize(args, check)
    return run_workers(args, replay)


def run_workers(args: argparse.Namespace, replay: ReplaySettings) -> int:
    """N replay workers as child processes of this one, until one fails or we are stopped."""
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
    argv = ["--log-level", args.log_level, "replay", "--settings", str(path)]
    with LocalStack(workdir.resolve()) as stack:  # stops what it started, also on Ctrl-C
        workers = [stack.start_worker(f"replay-{i}", argv) for i in range(replay.workers)]
        print(
            f"draftgen replay: {replay.workers} workers on {settings.dataset}; logs in "
            f"{workdir / 'logs'}",
            file=sys.stderr,
        )
        while all(worker.alive() for worker in workers):
            time.sleep(1.0)  # supervising children: nothing to await but their exit
        failed = next(worker for worker in workers if not worker.alive())
        raise CliError(f"worker {failed.name} exited; see {failed.log_path}")
