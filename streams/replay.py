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
import asyncio
import sys
from typing import Any

from sinks.shards import ShardStore


def replay_manifest(base: dict[str, Any]) -> dict[str, Any]:
    return {**base, "replay": True, "replay_from": "completions@earliest"}


def refusal(existing: dict[str, Any] | None, dataset: str) -> str | None:
    """A replay writes a version of its own: never into one built by a tokenize worker."""
    if existing is not None and not existing.get("replay"):
        return (
            f"dataset version {dataset!r} already exists and was not built by a replay; "
            "replay builds a new version: pick another --dataset"
        )
    return None


def cmd_replay(args: argparse.Namespace) -> int:
    from streams.cli import CliError, _tokenize_settings
    from streams.faust_app import run_worker
    from streams.observe_args import observe_settings
    from streams.tokenize_app import build_tokenize_app, manifest
    from streams.tokenizer_loading import load_tokenizer
    from streams.topics import ensure_topics

    settings = _tokenize_settings(args)
    loaded = load_tokenizer(settings.tokenizer_dir, settings.chat_template_file, settings.family)
    store = ShardStore(settings.storage.out, settings.dataset, settings.storage.storage_options())
    try:
        existing = store.manifest()
    except Exception as err:
        raise CliError(f"cannot read {store.url}: {type(err).__name__}") from None
    refused = refusal(existing, settings.dataset)
    if refused:
        # printed here: under `python -m streams.cli` its CliError is another class than ours
        print(f"draftgen replay: error: {refused}", file=sys.stderr)
        return 2
    store.write_manifest(replay_manifest(manifest(settings, loaded)))
    asyncio.run(ensure_topics(settings.kafka))
    app, _ = build_tokenize_app(settings, loaded, store, observe_settings(args))
    run_worker(app, args.log_level)
    return 0


def add_replay_command(commands: Any) -> None:
    from streams.cli import _add_kafka, _add_tokenize
    from streams.observe_args import add_observe_arguments

    replay = commands.add_parser(
        "replay",
        help="build a new dataset version from the stored completions (nothing regenerated)",
    )
    _add_kafka(replay)
    _add_tokenize(replay)
    add_observe_arguments(replay)
    replay.set_defaults(handler=cmd_replay)
