"""Ctrl-C (and SIGTERM, and a second Ctrl-C) stops every process a command started.

The real thing: `draftgen run` as a subprocess in a process group of its own, interrupted the
way a terminal does it (SIGINT to the whole foreground group) while Kafka's storage is being
formatted and then (the next run in the same work directory) while the broker starts, mid-run,
and twice in quick succession. Every descendant is recorded by PID (and start time, against PID
reuse) from /proc while the command runs; after it exits none may be alive, and a run in the same
work directory afterwards must complete.
The small tests below exercise the same machinery (`compose.process`) on plain Python
children, without Kafka.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from compose.process import TrackedChild, leftover_message
from compose.stack import draftgen_argv

# -- /proc ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str
    start: int  # clock ticks after boot: with the PID, names one process for good
    argv: tuple[str, ...]


def read_proc(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        if len(argv) == 1:  # a title set in place of argv (a child of the zygote): one string
            argv = argv[0].split()
        fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces
        return Proc(
            pid,
            int(fields[1]),
            fields[0],
            int(fields[19]),
            tuple(arg.decode(errors="replace") for arg in argv if arg),
        )
    except (OSError, ValueError, IndexError):  # gone while we read it
        return None


def descendants(root: int) -> list[Proc]:
    procs = [p for p in map(read_proc, (int(d) for d in os.listdir("/proc") if d.isdigit())) if p]
    children: dict[int, list[Proc]] = {}
    for proc in procs:
        children.setdefault(proc.ppid, []).append(proc)
    found: list[Proc] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return found


def alive(proc: Proc) -> bool:
    now = read_proc(proc.pid)
    return now is not None and now.start == proc.start and now.state not in ("Z", "X")


def poll_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.02)


def still_alive(procs: list[Proc], settle: float = 5.0) -> list[Proc]:
    """Those of `procs` alive after a short settling time (a SIGKILL is not instantaneous)."""
    deadline = time.monotonic() + settle
    while True:
        left = [proc for proc in procs if alive(proc)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


# -- a command and everything it starts --------------------------------------------------------


@dataclass
class Watched:
    """A command in a process group of its own; its descendants recorded while it runs."""

    argv: list[str]
    logs: Path
    cwd: Path | None = None
    env: dict[str, str] | None = None  # the whole environment (None: ours)
    popen: subprocess.Popen[bytes] = field(init=False)
    seen: dict[tuple[int, int], Proc] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / "stdout").open("wb") as out, (self.logs / "stderr").open("wb") as err:
            self.popen = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.cwd,
                env=self.env,
            )
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while self.popen.poll() is None:
            try:
                found = descendants(self.popen.pid)
            except Exception as err:  # keep watching; say so if a wait then fails
                self.errors.append(repr(err))
                continue
            with self._lock:
                for proc in found:
                    # the latest reading (a fork shows its parent's argv until its exec), but
                    # not a zombie's (no argv at all)
                    if proc.argv or (proc.pid, proc.start) not in self.seen:
                        self.seen[(proc.pid, proc.start)] = proc
            time.sleep(0.02)

    def started(self) -> list[Proc]:
        with self._lock:
            return list(self.seen.values())

    def wait_for(self, match: Callable[[Proc], bool], what: str, count: int = 1) -> None:
        """Until `count` of the command's own children (not their forks) match, alive; a
        child of its zygote (compose/zygote.py) is one of its own."""

        def found() -> int:
            started = self.started()
            parents = {self.popen.pid} | {
                p.pid for p in started if p.ppid == self.popen.pid and "compose.zygote" in p.argv
            }
            return len([p for p in started if p.ppid in parents and match(p) and alive(p)])

        poll_until(lambda: found() >= count or self.popen.poll() is not None, 300, what)
        assert self.popen.poll() is None, (
            f"exited before {what}:\n{self.output()}\nseen:\n{describe(self.started())}\n"
            f"watch errors: {self.errors[-3:]}"
        )

    def interrupt(self, sig: int = signal.SIGINT) -> None:
        """What a terminal does on Ctrl-C: the signal to the whole foreground group."""
        if self.popen.returncode is None:  # not reaped: the group is still ours
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout:.0f}s:\n{self.output()}") from None

    def running(self) -> bool:
        return self.popen.poll() is None

    def text(self) -> str:
        """Everything it printed, stdout then stderr."""
        return (self.logs / "stdout").read_text(errors="replace") + (
            self.logs / "stderr"
        ).read_text(errors="replace")

    def output(self) -> str:
        out = (self.logs / "stdout").read_text(errors="replace")
        err = (self.logs / "stderr").read_text(errors="replace")
        return f"--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}"

    def left_alive(self) -> list[Proc]:
        self.popen.wait(60)
        return still_alive(self.started())

    def clean_up(self) -> None:
        """Whatever the test leaves, by PID and start time: never anyone else's process."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
        for proc in self.started():
            if alive(proc):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)


def describe(procs: list[Proc]) -> str:
    return "\n".join(f"  pid {p.pid}: {' '.join(p.argv)[:160]}" for p in procs)


# -- draftgen run --------------------------------------------------------------------------------


def draftgen_run(workdir: Path, logs: Path) -> Watched:
    return Watched(draftgen_argv("run", "--workdir", str(workdir), "--limit", "5"), logs)


def is_kafka_broker(proc: Proc) -> bool:
    return "kafka.Kafka" in proc.argv


def is_kafka_format(proc: Proc) -> bool:
    """The short-lived JVM that formats Kafka's log directory before the broker's first start."""
    return "kafka.tools.StorageTool" in proc.argv and "format" in proc.argv


def is_worker(proc: Proc) -> bool:
    return "worker" in proc.argv and ("generate" in proc.argv or "tokenize" in proc.argv)


def is_emulator(proc: Proc) -> bool:
    return "emulate-server" in proc.argv


@pytest.mark.integration
@pytest.mark.parametrize(
    "moments",
    # the format's interruption, then the broker start's, in the same work directory: the
    # second run gets through a format left half done before it is itself interrupted, and
    # the complete run at the end starts from what both left (one complete run, not two)
    [("kafka-format", "kafka-starting"), ("mid-run",), ("twice",)],
    ids="-then-".join,
)
def test_interrupted_run_leaves_nothing_and_runs_again(
    tmp_path: Path, moments: tuple[str, ...]
) -> None:
    workdir = tmp_path / "run"
    for number, moment in enumerate(moments):
        interrupt_run(workdir, tmp_path / f"interrupted-{number}", moment)
    if moments == ("mid-run",):
        return  # "twice" stops at the same moment, then SIGKILLs: its re-run covers this one

    # the same work directory again, nothing cleaned up by hand: a complete run
    second = draftgen_run(workdir, tmp_path / "second")
    try:
        rc = second.wait(300)
        assert rc == 0, second.output()
        assert "done in" in (tmp_path / "second" / "stdout").read_text()
        left = second.left_alive()
        assert not left, f"left running after a complete run:\n{describe(left)}"
    finally:
        second.clean_up()


def interrupt_run(workdir: Path, logs: Path, moment: str) -> None:
    """`draftgen run` in `workdir`, Ctrl-C'd at `moment`: exit 130, nothing of it left alive."""
    first = draftgen_run(workdir, logs)
    try:
        if moment == "kafka-format":
            first.wait_for(is_kafka_format, "the JVM formatting Kafka's storage")
        elif moment == "kafka-starting":
            first.wait_for(is_kafka_broker, "the Kafka broker's JVM")
        else:
            first.wait_for(is_worker, "three workers", count=3)
        running = [p for p in first.started() if alive(p)]
        first.interrupt()
        if moment == "twice":
            # once the orderly stop has begun (one of its children is gone), the impatient
            # second Ctrl-C
            poll_until(
                lambda: any(not alive(p) for p in running) or first.popen.poll() is not None,
                60,
                "the stop to begin",
            )
            assert first.popen.poll() is None, "the run was over before the second Ctrl-C"
            first.interrupt()
        rc = first.wait(120)
        left = first.left_alive()
        assert not left, f"left running after Ctrl-C ({moment}):\n{describe(left)}"
        assert rc == 130, first.output()
        started = first.started()
        if moment == "kafka-format":
            assert not any(is_kafka_broker(p) for p in started), "interrupted after the format"
        else:
            assert any(is_kafka_broker(p) for p in started)
        if moment.startswith("kafka"):
            assert not any(is_emulator(p) for p in started), "interrupted after Kafka's start"
    finally:
        first.clean_up()


# -- the machinery on plain children, no Kafka -------------------------------------------------

_GUARDED = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from compose.process import ManagedProcess, interrupt_guard, stop_together

    logs = Path(sys.argv[1])
    polite = "import time; print('ready', flush=True); time.sleep(600)"
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(600)"
    )
    children = []
    try:
        with interrupt_guard(grace=120):
            try:
                for name, code in (("polite", polite), ("stubborn", stubborn)):
                    child = ManagedProcess(name, [sys.executable, "-c", code], logs / name)
                    children.append(child.start())
                time.sleep(600)
            finally:
                stop_together(children, grace=120)  # the stubborn one would hold this up
    except KeyboardInterrupt:
        sys.exit(130)
    """
)


def python_script(source: str, *args: str) -> list[str]:
    return [sys.executable, "-c", source, *args]


def wait_ready(logs: Path, *names: str) -> None:
    def ready() -> bool:
        return all(
            (logs / name).exists() and "ready" in (logs / name).read_text() for name in names
        )

    poll_until(ready, 30, f"{', '.join(names)} ready")


@pytest.mark.parametrize("first_signal", [signal.SIGTERM, signal.SIGINT])
def test_second_signal_kills_what_the_orderly_stop_waits_for(
    tmp_path: Path, first_signal: int
) -> None:
    logs = tmp_path / "children"
    command = Watched(python_script(_GUARDED, str(logs)), tmp_path / "command")
    try:
        wait_ready(logs, "polite", "stubborn")
        children = descendants(command.popen.pid)
        assert len(children) == 2, describe(children)
        command.interrupt(first_signal)
        # the polite child goes at once; the stubborn one ignores SIGTERM for the 120 s grace
        poll_until(lambda: any(not alive(p) for p in children), 30, "the polite child to stop")
        assert command.popen.poll() is None
        signalled = time.monotonic()
        command.interrupt(signal.SIGINT)
        assert command.wait(30) == 130
        assert time.monotonic() - signalled < 15, "the second signal did not escalate"
        assert not still_alive(children), describe(still_alive(children))
        assert "again: killed" in (tmp_path / "command" / "stderr").read_text()
    finally:
        command.clean_up()


_ASYNC = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from compose.process import interrupt_guard

    logs = Path(sys.argv[1])

    async def main():
        try:
            (logs / "waiting").touch()
            await asyncio.sleep(600)
        finally:
            await asyncio.sleep(0.1)  # an async clean-up, as closing a Kafka client is
            (logs / "cleaned-up").touch()

    try:
        with interrupt_guard():
            asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(130)
    """
)


def test_interrupt_inside_asyncio_run_lets_tasks_clean_up(tmp_path: Path) -> None:
    """Inside `asyncio.run` the first signal is raised from the loop, not in the middle of
    a task: the task is cancelled and its `finally` runs to the end."""
    logs = tmp_path / "marks"
    logs.mkdir()
    command = Watched(python_script(_ASYNC, str(logs)), tmp_path / "command")
    try:
        poll_until((logs / "waiting").exists, 30, "the task to wait")
        command.interrupt()
        assert command.wait(30) == 130, command.output()
        assert (logs / "cleaned-up").exists()
        assert "Traceback" not in command.output()
    finally:
        command.clean_up()


_UNGUARDED = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from compose.process import ManagedProcess

    logs = Path(sys.argv[1])
    code = "import time; print('ready', flush=True); time.sleep(600)"
    ManagedProcess("sleeper", [sys.executable, "-c", code], logs / "sleeper").start()
    import time
    while not (logs / "go").exists():  # the test has seen the child
        time.sleep(0.02)
    if sys.argv[2] == "kill-myself":
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("ending", ["normal-exit", "kill-myself"])
def test_children_do_not_outlive_a_command_that_forgot_them(tmp_path: Path, ending: str) -> None:
    """No guard, no stop: the atexit hook stops them on a normal exit; on a SIGKILL of the
    parent the kernel does (PR_SET_PDEATHSIG)."""
    logs = tmp_path / "children"
    command = Watched(python_script(_UNGUARDED, str(logs), ending), tmp_path / "command")
    try:
        wait_ready(logs, "sleeper")
        sleepers = descendants(command.popen.pid)
        assert len(sleepers) == 1, describe(sleepers)
        (logs / "go").touch()
        rc = command.wait(60)
        assert rc == (-signal.SIGKILL if ending == "kill-myself" else 0), command.output()
        assert not still_alive(sleepers), describe(sleepers)
        if ending == "normal-exit":
            assert "still running at exit: sleeper" in command.output()
    finally:
        command.clean_up()


def test_leftover_message_names_pids_and_how_to_stop_them() -> None:
    popen = subprocess.Popen([sys.executable, "-c", "pass"])
    popen.wait()
    message = leftover_message([TrackedChild("kafka", popen, 1)])
    assert f"kafka (pid {popen.pid})" in message
    assert f"kill -KILL {popen.pid}" in message
