"""Start a service as a child process, wait for a real readiness check, stop it by PID.

Every child is tracked from the moment it is spawned (`CHILDREN`) and runs in a process group
of its own, so a terminal's Ctrl-C reaches only us and we decide the order of the stop. The
price is that we must stop them on every way out; hence three safety nets:

- `interrupt_guard()` around a command: the first SIGINT/SIGTERM/SIGHUP raises
  KeyboardInterrupt into the main flow (its `finally` stops things in order), any further one
  SIGKILLs every child's group at once; leaving the block stops whatever is still running.
- an `atexit` hook stops children still running when the interpreter exits, and names (with a
  `kill` hint) any it could not stop.
- children spawned from the main thread get `PR_SET_PDEATHSIG` = SIGKILL (Linux): if we are
  killed outright (`kill -9`, a killed pytest), the kernel kills them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compose.children import (
    CHILDREN,
    STOP_SIGNALS,
    Child,
    in_main_thread,
    leftover_message,
    signal_group,
    spawn,
)
from compose.children import ChildRegistry as ChildRegistry  # re-exported
from compose.children import TrackedChild as TrackedChild  # re-exported
from compose.children import run_tracked as run_tracked  # re-exported


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free now (the usual small race is accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class ServiceError(RuntimeError):
    """A service could not be started or did not become ready."""


# -- the command's side: signals ---------------------------------------------------------------


@dataclass
class InterruptGuard:
    """State of one `interrupt_guard()` block."""

    since: int
    grace: float
    signals: list[int] = field(default_factory=list)
    closing: bool = False
    _pending: bool = False  # a first interrupt handed to an event loop, not raised yet
    _redeliver: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)  # watchdog vs. closing

    @property
    def interrupted(self) -> int | None:
        """The first stop signal received, if any."""
        return self.signals[0] if self.signals else None

    def handle(self, signum: int, _frame: object) -> None:
        if self._redeliver:  # our watchdog: the loop ended before raising the first one
            self._redeliver = False
            if not self.closing:
                self._interrupt()
            return
        self.signals.append(signum)
        if len(self.signals) == 1 and not self.closing:
            self._interrupt()  # the main flow's `finally` stops things in order
            return
        self._pending = False
        killed = CHILDREN.kill_groups(self.since)
        if killed:
            with contextlib.suppress(OSError, ValueError):  # a hung-up terminal
                print(
                    f"\ndraftgen: {signal.Signals(signum).name} again: killed the process "
                    f"groups of {' '.join(map(str, killed))}",
                    file=sys.stderr,
                    flush=True,
                )
        if not self.closing:
            raise KeyboardInterrupt  # abandon a clean-up that hangs; the children are gone

    def _interrupt(self) -> None:
        """KeyboardInterrupt in the main flow. Inside a running event loop (`asyncio.run`)
        it is raised from a callback of the loop rather than in the middle of whichever task
        runs now, so that `asyncio.run` cancels its tasks and their `finally` blocks run (as
        asyncio's own SIGINT handler would have it). Should the loop stop before running
        that callback, a watchdog thread delivers the signal again."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._pending = False
            raise KeyboardInterrupt from None
        self._pending = True
        loop.call_soon_threadsafe(self._raise_pending)
        threading.Thread(target=self._watch_pending, args=(loop,), daemon=True).start()

    def _raise_pending(self) -> None:
        if self._pending:
            self._pending = False
            raise KeyboardInterrupt

    def _watch_pending(self, loop: asyncio.AbstractEventLoop) -> None:
        while self._pending:
            time.sleep(0.1)
            with self._lock:
                if self._pending and not self.closing and not loop.is_running():
                    self._redeliver = True
                    signal.pthread_kill(threading.main_thread().ident or 0, self.signals[0])
                    return

    def close(self) -> None:
        """From here on a signal only kills, never interrupts the clean-up."""
        self.closing = True  # before the lock: a redelivery racing with us is then ignored
        with self._lock:
            self._pending = False


@contextlib.contextmanager
def interrupt_guard(grace: float = 10.0) -> Iterator[InterruptGuard]:
    """`with interrupt_guard():` around a command that starts processes.

    First SIGINT, SIGTERM or SIGHUP: KeyboardInterrupt in the main flow, whose `finally`
    stops its processes in order. Any further one: SIGKILL to the process group of every
    child started inside the block, then KeyboardInterrupt again. However the block is left,
    children started inside it that still run get SIGTERM, then SIGKILL after `grace`;
    survivors are named with a `kill` hint. Outside the main thread there are no handlers,
    only the clean-up on the way out."""
    guard = InterruptGuard(since=CHILDREN.mark, grace=grace)
    previous: dict[signal.Signals, Any] = {}
    if in_main_thread():
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, guard.handle)
    try:
        yield guard
    finally:
        guard.close()  # from here on a signal only kills, never interrupts us
        try:
            survivors = CHILDREN.stop(guard.since, grace)
            if survivors:
                with contextlib.suppress(OSError, ValueError):
                    print(leftover_message(survivors), file=sys.stderr, flush=True)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


# -- one service -------------------------------------------------------------------------------


@dataclass
class ManagedProcess:
    """One child process we started ourselves; only ever stopped through its own PID (and
    the process group it leads). With `forked`, a `python -m` command of this interpreter is
    forked from this process's zygote (compose/zygote.py) instead of exec'd: the same command,
    without paying its imports again."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    forked: bool = False
    popen: Child | None = field(default=None, init=False)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **(self.env or {})}
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            if self.forked and list(self.argv[:2]) == [sys.executable, "-m"]:
                from compose.zygote import zygote

                module, *args = self.argv[2:]
                self.popen = zygote().spawn(self.name, module, args, log=log, env=env, cwd=self.cwd)
                return self
            self.popen = spawn(
                self.name, self.argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.cwd
            )
        return self

    def respawn(self) -> ManagedProcess:
        """A new process with the same command, environment and log (after a kill or stop)."""
        again = ManagedProcess(
            self.name, self.argv, self.log_path, self.env, self.cwd, forked=self.forked
        )
        return again.start()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait_ready(self, check: Callable[[], bool], timeout: float) -> None:
        """Until `check()` holds; if it never does (exit, timeout, interrupt), the process is
        stopped before the exception propagates: nothing half-started is left behind."""
        try:
            self._wait_ready(check, timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServiceError(f"{self.name} exited early; see {self.log_path}:\n{self.tail()}")
            try:
                if check():
                    return
            except Exception:
                pass
            time.sleep(0.25)
        raise ServiceError(f"{self.name} not ready after {timeout:.0f}s; see {self.log_path}")

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL to it and its process group, as a crash would."""
        if self.popen is not None and self.popen.returncode is None:
            signal_group(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
        CHILDREN.forget_finished()

    def terminate(self) -> None:
        """SIGTERM to its process group, without waiting (see `stop_together`)."""
        if self.alive() and self.popen is not None:
            signal_group(self.popen.pid, signal.SIGTERM)

    def stop(self, grace: float = 10.0) -> None:
        stop_together([self], grace)


def stop_together(processes: Sequence[ManagedProcess], grace: float = 10.0) -> None:
    """SIGTERM to all at once, one shared `grace` for all of them, then SIGKILL."""
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + grace
    for process in processes:
        if process.popen is None:
            continue
        try:
            process.popen.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
    CHILDREN.forget_finished()
