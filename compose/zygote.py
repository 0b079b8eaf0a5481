"""`python -m` children forked from a process that has imported draftgen once (a zygote).

A worker or an emulated server spends most of its start importing faust, aiokafka, openai,
pydantic, transformers and pyarrow: 1.3–1.9 CPU seconds each, every time, and on a machine that
starts many of them together (a local run's fleet, the test suite) that CPU is the start's
critical path. The zygote imports them once, then forks one child per request; a child shares
the imported modules with it and runs `python -m MODULE ARGS...` as if exec'd: the module as
`__main__`, its own environment, working directory, stdout/stderr, session and process group.

- The zygote is a child of ours in a session of its own, single-threaded (a fork copies only the
  forking thread, so nothing in it may run threads), and ignores stop signals: only its parent
  stops it, by closing the socket (or by dying: PR_SET_PDEATHSIG). Stopping the zygote kills
  its children (they get PR_SET_PDEATHSIG too), so stopping them in order is the parent's job,
  by their PIDs, as with any child; the zygote is not in `CHILDREN` for that reason.
- A forked child is a grandchild of ours: `ForkedChild` is its `subprocess.Popen`-like handle
  (pid, poll, wait, returncode), the exit status relayed by the zygote.
- A child has called setsid() before its PID is handed out, so its process group can be
  signalled at once.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import setproctitle

from compose.children import CHILDREN, die_with_parent, signals_deferred, spawn

# what the `python -m streams` children import: the CLI, both workers, replay and the emulator
PRELOAD = (
    "streams.cli.main",
    "streams.cli.worker",
    "streams.cli.replay",
    "streams.cli.emulate",
    "streams.core.faust_app",
    "streams.core.topics",
    "streams.generate.app",
    "streams.tokenize.app",
    "compose.emulator.server",
    "compose.emulator.flags",
    "transformers",
    "pyarrow",
    "s3fs",
)


# -- the zygote's side ---------------------------------------------------------------------


def _serve(sock: socket.socket) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only the parent stops us (EOF on `sock`)
    for module in PRELOAD:
        with contextlib.suppress(ImportError):  # a child that needs it reports the error
            importlib.import_module(module)
    gc.freeze()  # the children's collections skip what we imported: fewer pages copied on write
    # a wake-up on SIGCHLD, to reap children and relay their exit statuses
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, "request")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    _send(sock, {"ready": os.getpid()})
    while True:
        for key, _ in selector.select():
            if key.data == "child":
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                _reap(sock)
                continue
            received = _receive(sock)
            if received is None:  # the parent is gone or done with us
                return
            request, fds = received
            ready_r, ready_w = os.pipe()
            die_with_us = die_with_parent()  # for the child, while we are its parent
            pid = os.fork()
            if pid == 0:  # the child: never returns into this loop
                selector.close()
                for fd in (wake_r, wake_w, ready_r, sock.fileno()):
                    os.close(fd)
                _become(request, fds, ready_w, die_with_us)
            for fd in (*fds, ready_w):
                os.close(fd)
            os.read(ready_r, 1)  # EOF once the child leads its own process group (or died)
            os.close(ready_r)
            _send(sock, {"spawned": pid})


def _receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """One request: an 8-byte length with the child's two fds (stdout, stderr), then the JSON."""
    head, fds, _, _ = socket.recv_fds(sock, 8, 2)
    body = _read_exactly(sock, 8 - len(head)) if head else None
    if body is None:
        return None
    body = _read_exactly(sock, int.from_bytes(head + body, "big"))
    return (json.loads(body), fds) if body is not None else None


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            return None
        data += more
    return bytes(data)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def _become(
    request: dict[str, Any], fds: list[int], ready: int, die_with_us: Callable[[], None] | None
) -> None:
    """In the forked child: `python -m MODULE ARGS`, from here to the interpreter's exit."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    if die_with_us is not None:
        die_with_us()
    os.close(ready)  # the zygote hands out our PID now
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in {devnull, *fds}:
        os.close(fd)
    # `ps` shows the command, not the zygote's: one string in argv's memory (setproctitle
    # finds that memory through the environment, so before the environment changes)
    setproctitle.setproctitle(" ".join([sys.executable, "-m", request["module"], *request["args"]]))
    os.environ.clear()
    os.environ.update(request["env"])
    if request["cwd"]:
        os.chdir(request["cwd"])
    # as `python -m` starts: the working directory first, then PYTHONPATH, then the rest
    extra = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = [os.getcwd(), *extra, *(e for e in sys.path[1:] if e not in extra)]
    sys.argv = [request["module"], *request["args"]]
    # SystemExit and errors leave through the interpreter as `python -m` would: atexit
    # handlers, stdio flushed, the traceback and exit status 1 for an uncaught error
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    sys.exit(0)


def main() -> None:
    _serve(socket.socket(fileno=int(sys.argv[1])))


# -- the parent's side ---------------------------------------------------------------------


class ForkedChild:
    """A `subprocess.Popen`-like handle of a child the zygote forked: what `Child` asks
    (compose/children.py); signals go to its process group by PID, as to any child's."""

    def __init__(self, zygote: Zygote, pid: int, argv: Sequence[str]):
        self._zygote = zygote
        self.pid = pid
        self.args = list(argv)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode


class Zygote:
    """The parent's end: `spawn()` a `python -m` child, learn how it ended."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = ours
        self._lock = threading.Lock()  # one request at a time: replies come in order
        self._changed = threading.Condition()
        self._exited: dict[int, int] = {}
        self._spawned: list[int] = []
        self._gone = False
        self.process = spawn(
            "zygote",
            [sys.executable, "-m", "compose.zygote", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            track=False,
        )
        theirs.close()
        self._lines = ours.makefile("rb")
        first = json.loads(self._lines.readline() or b"{}")
        if "ready" not in first:
            raise RuntimeError("the zygote did not start; run with exec'd children instead")
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()

    def spawn(
        self,
        name: str,
        module: str,
        args: Sequence[str],
        *,
        log: IO[Any],
        env: dict[str, str],
        cwd: Path | None = None,
    ) -> ForkedChild:
        """`python -m module args` forked, its stdout and stderr to `log`; tracked in
        `CHILDREN` as `compose.children.spawn`'s children are."""

        request = {"module": module, "args": list(args), "env": env, "cwd": str(cwd or "")}
        body = json.dumps(request).encode()
        with self._lock, signals_deferred():
            socket.send_fds(self._sock, [len(body).to_bytes(8, "big")], [log.fileno()] * 2)
            self._sock.sendall(body)
            with self._changed:
                if not self._changed.wait_for(lambda: self._spawned or self._gone, 30):
                    raise RuntimeError("the zygote did not fork in 30 s")
                if not self._spawned:
                    raise RuntimeError("the zygote is gone")
                pid = self._spawned.pop(0)
            child = ForkedChild(self, pid, [sys.executable, "-m", module, *args])
            CHILDREN.add(name, child)
        return child

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exited or self._gone, timeout)
            if pid in self._exited:
                return self._exited[pid]
            # the zygote died: its children got SIGKILL (PR_SET_PDEATHSIG)
            return -signal.SIGKILL if self._gone else None

    def close(self) -> None:
        """The zygote exits at the end of its socket (its children, if any left, die)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)

    def _read(self) -> None:
        for line in self._lines:
            message = json.loads(line)
            with self._changed:
                if "spawned" in message:
                    self._spawned.append(message["spawned"])
                else:
                    self._exited[message["exited"]] = message["code"]
                self._changed.notify_all()
        with self._changed:
            self._gone = True
            self._changed.notify_all()


_ZYGOTE: Zygote | None = None
_ZYGOTE_LOCK = threading.Lock()


def zygote() -> Zygote:
    """This process's zygote, started on first use (a few seconds: the imports)."""
    global _ZYGOTE
    with _ZYGOTE_LOCK:
        if _ZYGOTE is None or _ZYGOTE.process.poll() is not None:
            _ZYGOTE = Zygote()
        return _ZYGOTE


def start_in_background() -> None:
    """Start the zygote now, beside whatever else starts (Kafka), so the first child waits less."""
    threading.Thread(target=zygote, name="zygote-start", daemon=True).start()


if __name__ == "__main__":
    main()
