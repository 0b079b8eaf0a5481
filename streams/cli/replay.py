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
from typing import Any

from sinks.shards import ShardStore
from streams.core.errors import CliError


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
    from streams.cli.args import observe_settings, tokenize_settings
    from streams.core.faust_app import run_worker
    from streams.core.topics import ensure_topics
    from streams.tokenize.app import build_tokenize_app, manifest
    from streams.tokenize.loading import load_tokenizer

    settings = tokenize_settings(args)
    loaded = load_tokenizer(settings.tokenizer_dir, settings.chat_template_file, settings.family)
    store = ShardStore(settings.storage.out, settings.dataset, settings.storage.storage_options())
    try:
        existing = store.manifest()
    except Exception as err:
        raise CliError(f"cannot read {store.url}: {type(err).__name__}") from None
    refused = refusal(existing, settings.dataset)
    if refused:
        raise CliError(refused)
    store.write_manifest(replay_manifest(manifest(settings, loaded)))
    asyncio.run(ensure_topics(settings.kafka))
    app, _ = build_tokenize_app(settings, loaded, store, observe_settings(args))
    run_worker(app, args.log_level)
    return 0


def add_replay_command(commands: Any) -> None:
    from streams.cli.args import add_kafka, add_observe_arguments, add_tokenize

    replay = commands.add_parser(
        "replay",
        help="build a new dataset version from the stored completions (nothing regenerated)",
    )
    add_kafka(replay)
    add_tokenize(replay)
    add_observe_arguments(replay)
    replay.set_defaults(handler=cmd_replay)
