"""Resuming a `run`: a run stopped by Ctrl-C, SIGTERM, kill -9 or a reboot continues when the
same command is given again.

Its work directory holds `run.json`: the command (its parsed arguments, so `--limit 5` and
`--limit=5` are one command) and whether it finished. The same command, given from the same
directory, finds the newest unfinished run of it under `runs/` (or the one in `--workdir`) and
takes up its work directory: the same dataset version, its tokenize group, its broker's data
when the run started its own. What it publishes again is only what is not on the topic yet
(producers/publish.py, `skip_published`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from streams.core.errors import CliError

RUN_FILE = "run.json"
# where runs without --workdir keep theirs (relative to the current directory)
RUNS_DIR = Path("runs")
# arguments that do not make another command: where it keeps its files, how loud it is
NOT_THE_COMMAND = ("handler", "command", "log_level", "workdir")


def command_of(args: argparse.Namespace) -> dict[str, Any]:
    """What makes two `run` commands the same one: their parsed arguments, as JSON values."""
    values = {k: v for k, v in vars(args).items() if k not in NOT_THE_COMMAND}
    return dict(orjson.loads(orjson.dumps(values, default=str)))


@dataclass
class RunRecord:
    """`<workdir>/run.json`: the one encode/decode point."""

    command: dict[str, Any]
    finished: bool = False

    def write(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        staging = workdir / f".{RUN_FILE}.tmp"
        staging.write_bytes(orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2))
        staging.replace(workdir / RUN_FILE)  # a reader never sees half a file

    @classmethod
    def read(cls, workdir: Path) -> RunRecord | None:
        try:
            value = orjson.loads((workdir / RUN_FILE).read_bytes())
            return cls(command=dict(value["command"]), finished=bool(value["finished"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None


def unfinished_run(command: dict[str, Any], root: Path = RUNS_DIR) -> Path | None:
    """The newest work directory under `root` holding an unfinished run of `command`."""
    if not root.is_dir():
        return None
    candidates = sorted(
        (path for path in root.iterdir() if (path / RUN_FILE).is_file()),
        key=lambda path: (path / RUN_FILE).stat().st_mtime,
        reverse=True,
    )
    for path in candidates:
        record = RunRecord.read(path)
        if record is not None and not record.finished and record.command == command:
            return path.resolve()
    return None


def choose_workdir(workdir: str | None, command: dict[str, Any], new: Path) -> tuple[Path, bool]:
    """The run's work directory and whether it resumes one: `--workdir` when given (it resumes
    an unfinished run there of the same command, and refuses another command's), else the
    newest unfinished run of this command under runs/, else `new`."""
    if workdir is not None:
        path = Path(workdir).resolve()
        record = RunRecord.read(path)
        if record is None or record.finished:
            return path, False
        if record.command != command:
            raise CliError(
                f"--workdir {workdir} holds an unfinished run of another command: resume it "
                "with that command, or give another --workdir"
            )
        return path, True
    found = unfinished_run(command)
    return (found, True) if found is not None else (new.resolve(), False)


def resume_hint(draftgen: list[str]) -> str:
    """The one command that resumes this run: the same command, from the same directory."""
    return f"stopped; to resume, run the same command again from {Path.cwd()}: " + shlex.join(
        [*draftgen, *sys.argv[1:]]
    )
