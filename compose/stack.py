"""The one launcher API: Kafka, SeaweedFS, emulated servers and pipeline workers as child
processes of ours, each waited for with a real readiness check and stopped by its PID.
Used by `draftgen run` and by the test fixtures.

Every process is known to the stack (and to `compose.process.CHILDREN`) from the moment it is
spawned, before its readiness wait, so `stop_all` reaches it whenever the start is interrupted.
A command wraps itself in `compose.process.interrupt_guard` for the signal handling."""

from __future__ import annotations

import contextlib
import os
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from compose.kafka import KafkaBroker, KafkaCluster
from compose.process import (
    InterruptGuard,
    ManagedProcess,
    ServiceError,
    free_port,
    interrupt_guard,
    stop_together,
)
from compose.seaweedfs import SeaweedS3
from streams.core.stack_state import StackState


def draftgen_argv(*args: str, module: str = "streams") -> list[str]:
    """Run the CLI with this interpreter, whatever PATH says (`module`: a wrapper of it, such as
    the fault tests' launcher)."""
    return [sys.executable, "-m", module, *args]


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return bool(response.status == 200)


class LocalStack:
    """`with LocalStack(workdir) as stack:` for a command: the block runs under
    `interrupt_guard()` (first SIGINT/SIGTERM/SIGHUP → KeyboardInterrupt, a second one →
    SIGKILL of every child) and leaving it stops everything (`stop_all`, then the guard's
    own sweep for anything left). Tests may use it without `with` and call `stop_all`.

    `forked`: workers and emulated servers are forked from this process's zygote
    (compose/zygote.py), which imported their modules once, instead of exec'd."""

    def __init__(self, workdir: Path, forked: bool = False):
        self.workdir = workdir
        self.forked = forked
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kafka: KafkaBroker | None = None
        self.kafka_cluster: KafkaCluster | None = None
        self.s3: SeaweedS3 | None = None
        self.processes: list[ManagedProcess] = []
        self._servers: set[int] = set()  # id() of the emulators among `processes`
        self._names: dict[str, int] = {}
        self._exit = contextlib.ExitStack()
        self.guard: InterruptGuard | None = None

    def __enter__(self) -> LocalStack:
        try:
            self.guard = self._exit.enter_context(interrupt_guard())
            self._exit.callback(self.stop_all)  # runs before the guard's exit
        except BaseException:  # a signal in between: leave no handler behind
            self._exit.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._exit.__exit__(kind, error, traceback)

    def _log(self, name: str) -> Path:
        count = self._names[name] = self._names.get(name, 0) + 1
        return self.workdir / "logs" / f"{name}-{count}.log"

    # -- infrastructure ----------------------------------------------------------------------

    def start_kafka(self) -> str:
        self.kafka = KafkaBroker(self.workdir / "kafka")  # known before it is started
        self.kafka.start()
        return self.kafka.bootstrap

    def start_kafka_cluster(self, size: int = 3, min_insync: int = 2) -> KafkaCluster:
        """Several brokers on loopback, one KRaft quorum (compose/kafka.py)."""
        cluster = KafkaCluster(self.workdir / "kafka-cluster", size, min_insync=min_insync)
        self.kafka_cluster = cluster  # known before it is started: stop_all reaches it
        cluster.start()
        return cluster

    def start_s3(self) -> SeaweedS3:
        self.s3 = SeaweedS3(self.workdir / "s3")
        self.s3.start()
        return self.s3

    def start_emulator(
        self,
        tokenizer_dir: str | Path,
        *options: str,
        name: str = "emulator",
        kind: str = "sglang",
    ) -> str:
        return self.start_emulator_process(tokenizer_dir, *options, name=name, kind=kind)[0]

    def start_emulator_process(
        self,
        tokenizer_dir: str | Path,
        *options: str,
        name: str = "emulator",
        kind: str = "sglang",
        port: int | None = None,
    ) -> tuple[str, ManagedProcess]:
        """An emulated SGLang (or, `kind="vllm"`, vLLM) server on a free port (or `port`: one
        restarted where it was), once it serves."""
        port = port or free_port()
        process = ManagedProcess(
            name,
            draftgen_argv(
                "emulate-server",
                "--tokenizer-dir",
                str(tokenizer_dir),
                "--port",
                str(port),
                "--kind",
                kind,
                *options,
            ),
            self._log(name),
            forked=self.forked,
        )
        self.processes.append(process)
        self._servers.add(id(process))
        process.start()
        url = f"http://127.0.0.1:{port}"
        # vLLM has no /health_generate; its /health answers 200 once the engine serves
        ready = "/health" if kind == "vllm" else "/health_generate"
        process.wait_ready(lambda: _http_ok(f"{url}{ready}"), timeout=120)
        return url, process

    def restart(self, process: ManagedProcess) -> ManagedProcess:
        """Respawn a stopped or killed process of ours; the new one is tracked instead."""
        process.stop()
        fresh = process.respawn()
        self.processes[self.processes.index(process)] = fresh
        if id(process) in self._servers:
            self._servers.discard(id(process))
            self._servers.add(id(fresh))
        return fresh

    # -- pipeline workers --------------------------------------------------------------------

    def start_worker(
        self,
        name: str,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        module: str = "streams",
    ) -> ManagedProcess:
        # a preloaded library (LD_PRELOAD: libfaketime) takes effect at exec only, not in a fork
        forked = self.forked and "LD_PRELOAD" not in (env or {})
        process = ManagedProcess(
            name, draftgen_argv(*args, module=module), self._log(name), env=env, forked=forked
        )
        self.processes.append(process)
        process.start()
        return process

    def stop_all(self) -> None:
        """Workers, then emulated servers, then Kafka and S3; each tier stopped together
        (SIGTERM, one grace period, SIGKILL). Workers first, so they do not spend their last
        moments retrying a vanished broker or server. An exception in one tier (a second
        Ctrl-C) does not skip the next ones."""
        workers = [p for p in self.processes if id(p) not in self._servers]
        servers = [p for p in self.processes if id(p) in self._servers]
        infra = [s.process for s in (self.kafka, self.s3) if s is not None and s.process]
        if self.kafka_cluster is not None:
            infra += self.kafka_cluster.processes
        try:
            stop_together(workers)
        finally:
            try:
                stop_together(servers)
            finally:
                stop_together(infra, grace=20)


# -- the local stack that stays up (`draftgen stack up|down|status`) ----------------------------

# the bucket the stack's SeaweedFS starts with
STACK_BUCKET = "draftgen-local"
STACK_LOG = "supervisor.log"
# how often the supervisor looks at its services
STACK_WATCH_S = 5.0


# held by the supervisor for its life: one per directory, and only it touches `data/`
SUPERVISOR_LOCK = "supervisor.lock"
# held by `stack up` while it starts one (or waits for one starting): one start at a time
UP_LOCK = "up.lock"
# the supervisor's exit status when another one holds the directory
SUPERVISOR_TAKEN = 75


def hold_lock(path: Path) -> int | None:
    """An exclusive flock on `path`, held until the returned descriptor is closed (or the
    process exits, however it does); None if another process holds it."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def supervisor_running(directory: Path) -> bool:
    """Whether a supervisor holds `directory`: starting, or up."""
    fd = hold_lock(directory / SUPERVISOR_LOCK)
    if fd is None:
        return True
    os.close(fd)
    return False


def serve_stack(directory: Path) -> int:
    """The stack's supervisor, in the foreground: takes the directory's lock (or exits: another
    one has it), starts Kafka and SeaweedFS (fresh data under `directory/data`), writes the
    state file once both answer, watches them, and on SIGTERM (`stack down`) or if one of them
    dies, stops both and removes the state file."""
    import secrets
    import shutil
    import time

    from streams.core.stack_state import STATE_FILE, StackState, read_state

    lock = hold_lock(directory / SUPERVISOR_LOCK)  # for this process's life
    if lock is None:
        print(f"stack: another supervisor runs in {directory}", flush=True)
        return SUPERVISOR_TAKEN
    os.ftruncate(lock, 0)
    os.write(lock, str(os.getpid()).encode())  # `stack down` of a stack still starting
    data = directory / "data"
    # a stack starts empty: the last one's data goes (its supervisor is gone: we hold the lock)
    shutil.rmtree(data, ignore_errors=True)
    with LocalStack(data) as stack:
        try:
            bootstrap = stack.start_kafka()
            s3 = SeaweedS3(data / "s3", secret_key=secrets.token_hex(16))
            stack.s3 = s3
            s3.start()
            s3.create_bucket(STACK_BUCKET)
            state = StackState(
                pid=os.getpid(),
                bootstrap=bootstrap,
                s3_endpoint_url=s3.endpoint.endpoint_url,
                s3_access_key=s3.endpoint.access_key,
                s3_secret_key=s3.endpoint.secret_key,
                bucket=STACK_BUCKET,
                workdir=str(data),
            )
            state.write(directory)
            print(f"stack up: Kafka {bootstrap}, S3 {s3.endpoint.endpoint_url}", flush=True)
            services = [s.process for s in (stack.kafka, stack.s3) if s and s.process]
            while all(p.alive() for p in services):
                time.sleep(STACK_WATCH_S)  # a signal interrupts it (interrupt_guard)
            dead = ", ".join(p.name for p in services if not p.alive())
            print(f"stack: {dead} exited; stopping the stack", flush=True)
            return 1
        finally:
            mine = read_state(directory)
            if mine is not None and mine.pid == os.getpid():
                (directory / STATE_FILE).unlink(missing_ok=True)


def start_stack(directory: Path, timeout: float = 180.0) -> StackState:
    """`stack up`: the supervisor as a detached process (its own session, not a child that dies
    with us), waited for until its state file names it and its broker answers. One `stack up`
    at a time per directory; one that finds a supervisor starting (another `stack up`'s, or one
    left by an interrupted command) waits for it and uses it."""
    import subprocess
    import time

    from streams.core.stack_state import live_stack

    directory.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    up = hold_lock(directory / UP_LOCK)
    while up is None:  # another `stack up` is starting it: ours waits its turn
        if time.monotonic() > deadline:
            raise ServiceError(f"another `stack up` in {directory} did not finish")
        time.sleep(0.2)
        up = hold_lock(directory / UP_LOCK)
    log = directory / STACK_LOG
    popen: subprocess.Popen[bytes] | None = None
    try:
        while time.monotonic() < deadline:
            running = live_stack(directory)
            if running is not None:
                return running
            if popen is not None and popen.poll() not in (None, SUPERVISOR_TAKEN):
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                raise ServiceError(f"the stack did not start; see {log}:\n{tail}")
            if (popen is None or popen.poll() is not None) and not supervisor_running(directory):
                with open(log, "ab") as out:
                    popen = subprocess.Popen(
                        draftgen_argv("stack", "serve", "--stack-dir", str(directory)),
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # outlives this command and its terminal
                    )
            time.sleep(0.5)
        if popen is not None:
            popen.terminate()
        raise ServiceError(f"the stack not up after {timeout:.0f}s; see {log}")
    finally:
        os.close(up)


def stop_stack(directory: Path, timeout: float = 60.0) -> int | None:
    """`stack down`: SIGTERM to the supervisor (by the PID in the state file, or in its lock
    file while it starts), which stops its services; waits for it to exit. Its PID, or None if
    no stack runs."""
    import signal
    import time

    from streams.core.stack_state import STATE_FILE, live_stack

    state = live_stack(directory)
    pid = state.pid if state is not None else starting_supervisor(directory)
    if pid is None:
        (directory / STATE_FILE).unlink(missing_ok=True)  # a stale file: its supervisor is gone
        return None
    os.kill(pid, signal.SIGTERM)  # a supervisor still starting stops what it started too
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if live_stack(directory) is None and not _pid_running(pid):
            return pid
        time.sleep(0.25)
    raise ServiceError(
        f"the stack's supervisor (pid {pid}) did not stop in {timeout:.0f}s: "
        f"kill -KILL {pid} (its services die with it)"
    )


def starting_supervisor(directory: Path) -> int | None:
    """The PID of a supervisor that holds `directory` but has written no state file yet."""
    if not supervisor_running(directory):
        return None
    try:
        return int((directory / SUPERVISOR_LOCK).read_text().strip())
    except (OSError, ValueError):
        return None


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited: it waits only for its parent to reap it
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
