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
from typing import Any

from streams.cli.worker import add_tokenize_flags, run_tokenize
from streams.core.errors import CliError
from streams.core.settings import TokenizeSettings

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


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "replay",
        help="build a new dataset version from the stored completions (nothing regenerated)",
    )
    add_tokenize_flags(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    return run_tokenize(args, check)
