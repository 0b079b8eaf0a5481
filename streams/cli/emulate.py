"""`draftgen emulate-server`: the SGLang-compatible emulated server (compose/emulator/)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from compose.emulator.flags import add_emulator_arguments

    add_emulator_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from compose.emulator.flags import settings_from_args
    from compose.emulator.server import run as serve

    serve(settings_from_args(args))
    return 0
