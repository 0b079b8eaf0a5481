"""Which work directory a `run` takes up: the newest unfinished run of the same command."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from streams.cli.main import build_parser
from streams.cli.resume import RUN_FILE, RunRecord, choose_workdir, command_of, unfinished_run
from streams.core.errors import CliError


def command(*words: str) -> dict:
    argv = ["run", *words]
    return command_of(build_parser(argv).parse_args(argv))


def test_the_same_command_is_the_same_whatever_its_spelling_log_level_or_workdir() -> None:
    assert command("a.jsonl", "--limit", "5") == command("a.jsonl", "--limit=5")
    assert command("a.jsonl", "--workdir", "x") == command("a.jsonl")
    assert command("a.jsonl") != command("b.jsonl")
    assert command("a.jsonl", "--limit", "5") != command("a.jsonl", "--limit", "6")


def test_a_run_record_is_read_back_and_a_broken_one_is_no_run(tmp_path: Path) -> None:
    RunRecord(command("a.jsonl"), finished=True).write(tmp_path)
    assert RunRecord.read(tmp_path) == RunRecord(command("a.jsonl"), finished=True)
    (tmp_path / RUN_FILE).write_text("{half")
    assert RunRecord.read(tmp_path) is None
    assert RunRecord.read(tmp_path / "missing") is None


def _run_dir(root: Path, name: str, cmd: dict, finished: bool, mtime: float) -> Path:
    path = root / name
    RunRecord(cmd, finished=finished).write(path)
    os.utime(path / RUN_FILE, (mtime, mtime))
    return path


def test_the_newest_unfinished_run_of_the_same_command_is_resumed(tmp_path: Path) -> None:
    mine, other = command("a.jsonl"), command("b.jsonl")
    _run_dir(tmp_path, "1-old", mine, finished=False, mtime=1_000)
    newest = _run_dir(tmp_path, "2-newer", mine, finished=False, mtime=2_000)
    _run_dir(tmp_path, "3-done", mine, finished=True, mtime=3_000)
    _run_dir(tmp_path, "4-other", other, finished=False, mtime=4_000)
    (tmp_path / "5-no-record").mkdir()

    assert unfinished_run(mine, tmp_path) == newest.resolve()
    assert unfinished_run(command("c.jsonl"), tmp_path) is None
    assert unfinished_run(mine, tmp_path / "absent") is None


def test_workdir_resumes_its_own_command_and_refuses_another(tmp_path: Path) -> None:
    mine = command("a.jsonl")
    RunRecord(mine).write(tmp_path / "w")
    assert choose_workdir(str(tmp_path / "w"), mine, tmp_path / "new") == (
        (tmp_path / "w").resolve(),
        True,
    )
    with pytest.raises(CliError, match="unfinished run of another command"):
        choose_workdir(str(tmp_path / "w"), command("b.jsonl"), tmp_path / "new")
    # a finished one is a work directory like any other: a new run in it
    RunRecord(mine, finished=True).write(tmp_path / "w")
    assert choose_workdir(str(tmp_path / "w"), command("b.jsonl"), tmp_path / "new") == (
        (tmp_path / "w").resolve(),
        False,
    )


def test_without_workdir_a_new_run_starts_when_none_is_unfinished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert choose_workdir(None, command("a.jsonl"), Path("runs/new")) == (
        (tmp_path / "runs/new").resolve(),
        False,
    )
    RunRecord(command("a.jsonl")).write(tmp_path / "runs" / "earlier")
    assert choose_workdir(None, command("a.jsonl"), Path("runs/new")) == (
        (tmp_path / "runs" / "earlier").resolve(),
        True,
    )
