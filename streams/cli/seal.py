"""`draftgen seal`: the manifest of a dataset version that has caught up with `completions`."""

from __future__ import annotations

import argparse
import asyncio
import sys

from streams.cli.flags import add_flags, build
from streams.core.settings import SealSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, SealSettings)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    settings = build(SealSettings, args)  # first: a bad setting is said before the imports
    from sinks.shards import ShardStore
    from streams.tools.seal import seal

    storage = settings.storage
    store = ShardStore(storage.out, settings.dataset, storage.storage_options())

    def show(lag: int) -> None:
        if sys.stderr.isatty():
            print(f"\rwaiting for {lag} completions to be committed", end="", file=sys.stderr)

    manifest = asyncio.run(seal(settings.kafka, store, settings.timeout_s, show))
    drops = sum(manifest.drops.values())
    print(
        f"sealed {settings.dataset}: {manifest.samples} samples, {manifest.tokens} tokens in "
        f"{len(manifest.shards)} shards; {drops} recorded drops; "
        f"{manifest.replaced} earlier answers replaced"
    )
    return 0
