"""One stack per directory: two `draftgen stack up` started at once, the first interrupted while
its supervisor starts. The supervisor goes on starting (it is detached), the second `stack up`
waits for it and uses it, nothing removed its data, and no second supervisor is left."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from compose.stack import SUPERVISOR_LOCK, draftgen_argv, starting_supervisor, supervisor_running
from streams.core.stack_state import STATE_FILE, live_stack
from tests.polling import wait_for


def _supervisors(directory: Path) -> list[int]:
    """Live `stack serve` processes of `directory`, by /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"serve" in argv and str(directory).encode() in argv and state != "Z":
            found.append(int(entry))
    return found


def test_two_stack_ups_at_once_one_interrupted_leave_one_stack(tmp_path: Path) -> None:
    directory = tmp_path / "stack"
    up = draftgen_argv("stack", "up", "--stack-dir", str(directory))

    def start(name: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            up,
            stdout=(tmp_path / f"{name}.out").open("w"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )

    first, second = start("first"), start("second")
    try:
        wait_for(lambda: supervisor_running(directory), 60, "a supervisor to take the directory")
        assert live_stack(directory) is None, "the stack was up before the interruption"
        first.send_signal(signal.SIGINT)  # Ctrl-C on the first while its supervisor starts
        assert first.wait(30) == 130
        assert starting_supervisor(directory) is not None

        assert second.wait(240) == 0, (tmp_path / "second.out").read_text()
        state = live_stack(directory)
        assert state is not None
        said = (tmp_path / "second.out").read_text()
        assert f"(supervisor pid {state.pid})" in said, said
        assert _supervisors(directory) == [state.pid]
        assert int((directory / SUPERVISOR_LOCK).read_text()) == state.pid
        assert (Path(state.workdir) / "kafka").is_dir(), "the live stack's data was removed"

        down = subprocess.run(
            draftgen_argv("stack", "down", "--stack-dir", str(directory)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert down.returncode == 0 and f"was pid {state.pid}" in down.stdout, down.stdout
        assert not (directory / STATE_FILE).exists()
        assert _supervisors(directory) == []
    finally:
        for popen in (first, second):
            if popen.poll() is None:
                popen.kill()
        for pid in _supervisors(directory):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
