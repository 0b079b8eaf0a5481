"""`draftgen status`: where a run stands; `--watch` refreshes."""

from __future__ import annotations

import argparse
from typing import Any

from streams.cli.flags import add_flags, build
from streams.core.settings import StatusSettings


def register(commands: Any) -> None:
    parser = commands.add_parser("status", help="where a run stands; --watch refreshes")
    add_flags(parser, StatusSettings)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from streams.ops.status import run_status

    return run_status(build(StatusSettings, args))
