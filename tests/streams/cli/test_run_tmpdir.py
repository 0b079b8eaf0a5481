"""`draftgen run` keeps its workers' temporary files (faust's datadir) in its workdir."""

from __future__ import annotations

from pathlib import Path

from streams.cli.run import worker_env


def test_run_gives_its_workers_a_tmpdir_under_the_workdir(tmp_path: Path) -> None:
    env = worker_env(tmp_path / "runs" / "t")
    tmp = Path(env["TMPDIR"])
    assert tmp == tmp_path / "runs" / "t" / "tmp" and tmp.is_dir()
