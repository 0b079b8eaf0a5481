"""A child forked from the zygote runs `python -m MODULE ARGS` as an exec'd one would."""

from __future__ import annotations

import signal
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from compose.process import ManagedProcess
from compose.zygote import Zygote
from tests.polling import wait_for


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    own = Zygote()
    yield own
    own.close()


@pytest.fixture
def probe(tmp_path: Path) -> str:
    """A module that says where it runs, then exits as its argument asks."""
    package = tmp_path / "probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(
        textwrap.dedent(
            """
            import os, sys, time
            print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("PROBE"))
            print("pgid", os.getpgid(0) == os.getpid(), "main", __name__, flush=True)
            print("to stderr", file=sys.stderr, flush=True)
            how = sys.argv[1]
            if how == "sleep":
                time.sleep(60)
            if how == "error":
                raise RuntimeError("boom")
            sys.exit(int(how))
            """
        )
    )
    return str(tmp_path)


def start(zygote: Zygote, probe: str, tmp_path: Path, how: str) -> ManagedProcess:
    process = ManagedProcess(
        "probe",
        [sys.executable, "-m", "probe_pkg", how],
        tmp_path / f"probe-{how}.log",
        env={"PROBE": "yes", "PYTHONPATH": probe},
        cwd=tmp_path,
        forked=True,
    )
    return process.start()


def test_a_forked_child_is_the_module_run_as_main(
    zygote: Zygote, probe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("compose.zygote.zygote", lambda: zygote)
    process = start(zygote, probe, tmp_path, "3")
    assert process.popen is not None and process.popen.wait(30) == 3
    log = process.log_path.read_text()
    assert f"argv ['3'] cwd {tmp_path} env yes" in log
    assert "pgid True main __main__" in log
    assert "to stderr" in log


def test_an_uncaught_error_is_a_traceback_and_status_1(
    zygote: Zygote, probe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("compose.zygote.zygote", lambda: zygote)
    process = start(zygote, probe, tmp_path, "error")
    assert process.popen is not None and process.popen.wait(30) == 1
    assert "RuntimeError: boom" in process.log_path.read_text()


def test_a_killed_child_reports_the_signal_and_its_group_is_gone(
    zygote: Zygote, probe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("compose.zygote.zygote", lambda: zygote)
    process = start(zygote, probe, tmp_path, "sleep")
    wait_for(lambda: "pgid" in process.log_path.read_text(), 30, "the probe to start")
    assert process.alive() and process.pid is not None
    # what `ps` shows is the child's command, not the zygote's
    assert b" -m probe_pkg sleep" in Path(f"/proc/{process.pid}/cmdline").read_bytes()
    process.kill()
    assert process.popen is not None and process.popen.returncode == -signal.SIGKILL
    assert gone(process.popen.pid)


def test_the_zygotes_end_ends_its_children(probe: str, tmp_path: Path) -> None:
    """A parent gone (its socket closed) takes the zygote and every forked child with it."""
    own = Zygote()
    log_path = tmp_path / "orphan.log"
    with open(log_path, "ab") as log:
        child = own.spawn("probe", "probe_pkg", ["sleep"], log=log, env={"PYTHONPATH": probe})
    wait_for(lambda: "pgid" in log_path.read_text(), 30, "the probe to start")
    own.close()
    wait_for(lambda: own.process.poll() is not None, 10, "the zygote to exit")

    wait_for(lambda: gone(child.pid), 10, "its child to die with it")


def gone(pid: int) -> bool:
    """Dead: no such process, or a zombie nobody has reaped yet."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status
