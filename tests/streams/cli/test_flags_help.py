"""Every flag of every command says what it does in `--help`."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from streams.cli.main import build_parser


def flags(parser: argparse.ArgumentParser, path: str = "draftgen") -> Iterator[tuple[str, str]]:
    for action in parser._actions:  # argparse has no public walk of its parsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from flags(sub, f"{path} {name}")
        elif action.option_strings and action.help != argparse.SUPPRESS:
            yield path, action.option_strings[-1] if not action.help else ""


def test_every_flag_has_help() -> None:
    found = list(flags(build_parser()))
    assert len(found) > 100  # the walk reached the subcommands
    missing = [f"{command} {flag}" for command, flag in found if flag]
    assert missing == [], f"flags without help: {missing}"
