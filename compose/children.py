"""Every child process of ours, tracked from the moment it is spawned (`CHILDREN`), each in a
process group of its own; compose/process.py explains why and the three safety nets."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def signal_group(pgid: int, sig: int) -> bool:
    """Signal the process group we created for a child; False once the group is gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # not ours (any more)
        return False


class Child(Protocol):
    """What we use of a child's handle: a `subprocess.Popen`, or a `ForkedChild` (zygote.py)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class TrackedChild:
    """One child of ours: its PID is also the ID of the process group it leads."""

    name: str
    popen: Child
    seq: int

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        """Not reaped yet, or something is left in its process group."""
        if self.popen.returncode is None and self.popen.poll() is None:
            return True
        return signal_group(self.pid, 0)


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

    def add(self, name: str, popen: Child) -> TrackedChild:
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
        return [child.pid for child in self.children(since) if signal_group(child.pid, sig)]

    def stop(self, since: int = 0, grace: float = 10.0) -> list[TrackedChild]:
        """SIGTERM to each still-running child's group, SIGKILL after `grace`; returns any
        that still survive (uninterruptible, or not ours to signal)."""
        targets = self.running(since)
        for child in targets:
            signal_group(child.pid, signal.SIGTERM)
        _wait_all(targets, grace)
        for child in targets:
            if child.running():
                signal_group(child.pid, signal.SIGKILL)
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


def in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP back while a child is forked and registered, so an
    interrupt cannot fall between the fork and the registration; re-raised afterwards."""
    if not in_main_thread():  # Python runs signal handlers in the main thread only
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


def die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn: the kernel SIGKILLs the child when we die (Linux). Only for children
    spawned from the main thread: the signal follows the death of the spawning thread."""
    global _libc
    if not sys.platform.startswith("linux") or not in_main_thread():
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
    pass_fds: Sequence[int] = (),
    track: bool = True,
) -> subprocess.Popen[Any]:
    """Popen in a new process group, registered in `CHILDREN` (unless `track` is False) before
    any signal is handled."""
    with signals_deferred():
        popen = subprocess.Popen(
            list(argv),
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            text=text,
            pass_fds=pass_fds,
            start_new_session=True,  # a Ctrl-C in the terminal reaches us, not the child
            preexec_fn=die_with_parent(),
        )
        if track:
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
        signal_group(popen.pid, signal.SIGKILL)
        popen.wait()
        raise
    finally:
        CHILDREN.forget_finished()
    if popen.returncode != 0:
        raise subprocess.CalledProcessError(popen.returncode, list(argv), out, err)
    return subprocess.CompletedProcess(list(argv), popen.returncode, out, err)
