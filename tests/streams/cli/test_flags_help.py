"""Every flag of every command says what it does in `--help`, one name is used for one concept
across commands, and an earlier spelling is still accepted and says that it is one."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.cli.main import build_parser


def actions(
    parser: argparse.ArgumentParser, path: str = "draftgen"
) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:  # argparse has no public walk of its parsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from actions(sub, f"{path} {name}")
        elif action.option_strings and action.help != argparse.SUPPRESS:
            yield path, action


def test_every_flag_has_help() -> None:
    found = list(actions(build_parser()))
    assert len(found) > 100  # the walk reached the subcommands
    missing = [f"{command} {a.option_strings[-1]}" for command, a in found if not a.help]
    assert missing == [], f"flags without help: {missing}"


def test_an_earlier_spelling_is_named_as_one_in_the_help() -> None:
    unsaid = [
        f"{command} {alias}"
        for command, action in actions(build_parser())
        if not isinstance(action, argparse._HelpAction)
        for alias in action.option_strings[1:]
        if f"{alias}: the earlier spelling" not in (action.help or "")
    ]
    assert unsaid == [], f"aliases the help does not name: {unsaid}"


# spellings that named two concepts: the storage root (--out) and a file (now --to); a count of
# emulated servers (now --emulated-servers) and a server URL (--server); a tokenizer directory
# (--tokenizer-dir everywhere)
RETIRED = {"--output", "--servers", "--tokenizer"}


def test_one_name_per_concept_across_commands() -> None:
    primary = {action.option_strings[0] for _, action in actions(build_parser())}
    assert primary.isdisjoint(RETIRED)
    assert {"--out", "--to", "--server", "--emulated-servers", "--tokenizer-dir"} <= primary


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["export", "--out", "o", "--dataset", "v", "--format", "hf", "--output", "x"], "to", "x"),
        (["run", "--servers", "3"], "emulated_servers", 3),
        (["worker", "tokenize", "--tokenizer", "t"], "tokenizer_dir", "t"),
        (["emulate-server", "--tokenizer", "."], "tokenizer_dir", Path(".")),
    ],
)
def test_an_earlier_spelling_still_sets_its_setting(
    argv: list[str], dest: str, value: object
) -> None:
    assert getattr(build_parser().parse_args(argv), dest) == value
