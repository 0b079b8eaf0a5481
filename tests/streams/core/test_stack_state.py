"""The local stack's state file: found by the settings when nothing else names a broker, its
bucket's credentials used for that bucket only, a stale file (supervisor gone) ignored."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.cli.run_summary import print_next_steps
from streams.core.settings import KafkaSettings, StackSettings, StorageSettings, current_stack
from streams.core.stack_state import StackState, live_stack, supervisor_alive
from tests.polling import wait_for


@pytest.fixture
def supervisor() -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line says `stack serve`, as the real supervisor's does."""
    code = "import sys; sys.stdin.read()"
    process = subprocess.Popen(
        [sys.executable, "-c", code, "stack", "serve"], stdin=subprocess.PIPE
    )
    # until it execs, the child's command line is still the parent's
    wait_for(lambda: supervisor_alive(process.pid), 10, "the stand-in to exec")
    yield process
    process.kill()  # by its PID
    process.wait()


def state(pid: int) -> StackState:
    return StackState(
        pid=pid,
        bootstrap="127.0.0.1:19092",
        s3_endpoint_url="http://127.0.0.1:18333",
        s3_access_key="local",
        s3_secret_key="s3cret",
        bucket="draftgen-local",
        workdir="/nowhere",
    )


def test_commands_find_the_running_stack(
    supervisor: subprocess.Popen[bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTGEN_STACK_DIR", str(tmp_path))
    monkeypatch.delenv("DRAFTGEN_BOOTSTRAP", raising=False)
    for name in ("DRAFTGEN_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL", "DRAFTGEN_S3_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    with pytest.raises(ValueError):
        KafkaSettings()  # no stack yet: the broker is missing
    running = state(supervisor.pid)
    path = running.write(tmp_path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert current_stack() == running
    assert KafkaSettings().bootstrap == "127.0.0.1:19092"
    assert KafkaSettings(bootstrap="b:1").bootstrap == "b:1"  # a flag wins
    monkeypatch.setenv("DRAFTGEN_BOOTSTRAP", "e:2")
    assert KafkaSettings().bootstrap == "e:2"  # so does the environment
    options = StorageSettings(out="s3://draftgen-local/data").storage_options()
    assert (options["key"], options["secret"]) == ("local", "s3cret")
    assert options["client_kwargs"]["endpoint_url"] == "http://127.0.0.1:18333"
    assert "key" not in StorageSettings(out="s3://elsewhere/data").storage_options()
    assert "s3cret" not in repr(running)


def test_a_stale_state_file_is_ignored(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "pass", "stack", "serve"], check=True)
    assert done.returncode == 0
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    state(gone.pid).write(tmp_path)
    assert live_stack(tmp_path) is None
    # a live pid that is not a supervisor (recycled): ignored too
    import os

    state(os.getpid()).write(tmp_path)
    assert live_stack(tmp_path) is None


def test_the_next_steps_work_as_printed(capsys: pytest.CaptureFixture[str]) -> None:
    where = {"out": "/data/out", "dataset": "sample", "tokenizer": "/tok"}
    print_next_steps(**where, broker=None, broker_kept=True)
    kept = capsys.readouterr().out
    assert "stack down" in kept and "--bootstrap" not in kept
    for step in ("report", "export", "status", "dead-letters", "replay", "seal"):
        assert f" {step} " in kept or kept.count(f" {step}\n"), step
    print_next_steps(**where, broker="127.0.0.1:9", broker_kept=False)
    gone = capsys.readouterr().out
    assert "the broker stopped with this run" in gone and "stack up" in gone
    assert "where it stands" not in gone and "rebuild" not in gone
    print_next_steps(**where, broker="k:9092", broker_kept=True, topic_prefix="p-")
    theirs = capsys.readouterr().out
    assert "seal --out /data/out --dataset sample --bootstrap k:9092 --topic-prefix p-" in theirs
    assert "stack down" not in theirs


def test_the_kept_stack_lives_in_this_users_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """XDG_STATE_HOME is honoured, as by the crash notes: on a shared machine a user's run
    never attaches to (nor `down` stops) another user's stack."""
    monkeypatch.delenv("DRAFTGEN_STACK_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert StackSettings().path == tmp_path / "draftgen" / "stack"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert StackSettings().path == Path.home() / ".local" / "state" / "draftgen" / "stack"
    assert StackSettings(stack_dir=str(tmp_path / "s")).path == tmp_path / "s"
