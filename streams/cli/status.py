"""`draftgen status`: where a run stands; `--watch` refreshes."""

from __future__ import annotations

import argparse

from streams.cli.flags import add_flags, build
from streams.core.settings import StatusSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, StatusSettings)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from streams.tools.status import run_status

    return run_status(build(StatusSettings, args))
