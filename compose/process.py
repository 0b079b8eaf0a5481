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
import atexit
import contextlib
import ctypes
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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


# -- tracking every child ----------------------------------------------------------------------


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal the process group we created for a child; False once the group is gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # not ours (any more)
        return False


@dataclass
class TrackedChild:
    """One child of ours: its PID is also the ID of the process group it leads."""

    name: str
    popen: subprocess.Popen[Any]
    seq: int

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        """Not reaped yet, or something is left in its process group."""
        if self.popen.returncode is None and self.popen.poll() is None:
            return True
        return _signal_group(self.pid, 0)


class ChildRegistry:
    """Every child process we spawned, from its fork until it and its group are gone.

    The signal-handler side (`kill_groups`) only sends signals and takes no lock, so it is
    safe to call from a handler that interrupted any other method here."""

    def __init__(self) -> None:
        self._children: dict[int, TrackedChild] = {}
        self._seq = itertools.count(1)
        self._last = 0
        self._atexit = False

    @property
    def mark(self) -> int:
        """Children registered after this moment have a greater `seq`."""
        return self._last

    def add(self, name: str, popen: subprocess.Popen[Any]) -> TrackedChild:
        child = TrackedChild(name, popen, next(self._seq))
        self._last = child.seq
        self._children[popen.pid] = child
        if not self._atexit:
            self._atexit = True
            atexit.register(_stop_at_exit, self)
        return child

    def children(self, since: int = 0) -> list[TrackedChild]:
        return [child for child in list(self._children.values()) if child.seq > since]

    def forget_finished(self) -> None:
        for child in self.children():
            if not child.running():
                self._children.pop(child.pid, None)

    def running(self, since: int = 0) -> list[TrackedChild]:
        self.forget_finished()
        return [child for child in self.children(since) if child.running()]

    def kill_groups(self, since: int = 0, sig: int = signal.SIGKILL) -> list[int]:
        """Signal every tracked child's process group now; no waiting, no locks."""
        return [child.pid for child in self.children(since) if _signal_group(child.pid, sig)]

    def stop(self, since: int = 0, grace: float = 10.0) -> list[TrackedChild]:
        """SIGTERM to each still-running child's group, SIGKILL after `grace`; returns any
        that still survive (uninterruptible, or not ours to signal)."""
        targets = self.running(since)
        for child in targets:
            _signal_group(child.pid, signal.SIGTERM)
        _wait_all(targets, grace)
        for child in targets:
            if child.running():
                _signal_group(child.pid, signal.SIGKILL)
        _wait_all(targets, 5.0)
        self.forget_finished()
        return [child for child in targets if child.running()]


def _wait_all(children: Iterable[TrackedChild], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.popen.wait(max(0.0, deadline - time.monotonic()))
    while any(child.running() for child in children) and time.monotonic() < deadline:
        time.sleep(0.05)  # a reaped leader whose group still has members


def leftover_message(children: Sequence[TrackedChild]) -> str:
    pids = " ".join(str(child.pid) for child in children)
    names = ", ".join(f"{child.name} (pid {child.pid})" for child in children)
    return (
        f"draftgen: could not stop {names}; they run in process groups of their own: "
        f"stop them with `kill -KILL {pids}` (or `kill -KILL -- -<pid>` for a whole group)"
    )


def _stop_at_exit(registry: ChildRegistry) -> None:
    running = registry.running()
    if not running:
        return
    names = ", ".join(f"{child.name} (pid {child.pid})" for child in running)
    with contextlib.suppress(OSError, ValueError):
        print(f"draftgen: stopping children still running at exit: {names}", file=sys.stderr)
    survivors = registry.stop(grace=5.0)
    if survivors:
        with contextlib.suppress(OSError, ValueError):
            print(leftover_message(survivors), file=sys.stderr)


CHILDREN = ChildRegistry()


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP back while a child is forked and registered, so an
    interrupt cannot fall between the fork and the registration; re-raised afterwards."""
    if not _in_main_thread():  # Python runs signal handlers in the main thread only
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    if any(handler is None for handler in previous.values()):  # not restorable from Python
        yield
        return
    caught: list[int] = []
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


_PR_SET_PDEATHSIG = 1
_libc: Any = None


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn: the kernel SIGKILLs the child when we die (Linux). Only for children
    spawned from the main thread: the signal follows the death of the spawning thread."""
    global _libc
    if not sys.platform.startswith("linux") or not _in_main_thread():
        return None
    if _libc is None:
        try:  # the symbols already loaded (libc's among them): no `ldconfig` child to find it
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.prctl  # noqa: B018 - fails here, not in the child, if it is missing
        except (OSError, AttributeError):
            return None
    prctl = _libc.prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # we died before the prctl took effect
            os._exit(1)

    return preexec


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    stdout: int | IO[Any] | None = subprocess.DEVNULL,
    stderr: int | IO[Any] | None = subprocess.STDOUT,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    text: bool = False,
) -> subprocess.Popen[Any]:
    """Popen in a new process group, registered in `CHILDREN` before any signal is handled."""
    with _signals_deferred():
        popen = subprocess.Popen(
            list(argv),
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            text=text,
            start_new_session=True,  # a Ctrl-C in the terminal reaches us, not the child
            preexec_fn=_die_with_parent(),
        )
        CHILDREN.add(name, popen)
    return popen


def run_tracked(
    name: str, argv: Sequence[str], *, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(argv, capture_output=True, text=True, check=True)` for a short-lived
    child, tracked like a service and killed (group and all) if we are interrupted."""
    popen = spawn(name, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = popen.communicate(timeout=timeout)
    except BaseException:
        _signal_group(popen.pid, signal.SIGKILL)
        popen.wait()
        raise
    finally:
        CHILDREN.forget_finished()
    if popen.returncode != 0:
        raise subprocess.CalledProcessError(popen.returncode, list(argv), out, err)
    return subprocess.CompletedProcess(list(argv), popen.returncode, out, err)


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
    if _in_main_thread():
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
    the process group it leads)."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.popen = spawn(
                self.name,
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(self.env or {})},
                cwd=self.cwd,
            )
        return self

    def respawn(self) -> ManagedProcess:
        """A new process with the same command, environment and log (after a kill or stop)."""
        return ManagedProcess(self.name, self.argv, self.log_path, self.env, self.cwd).start()

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
            _signal_group(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
        CHILDREN.forget_finished()

    def terminate(self) -> None:
        """SIGTERM to its process group, without waiting (see `stop_together`)."""
        if self.alive() and self.popen is not None:
            _signal_group(self.popen.pid, signal.SIGTERM)

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
