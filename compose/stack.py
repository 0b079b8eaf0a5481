"""The one launcher API: Kafka, SeaweedFS, emulated servers and pipeline workers as child
processes of ours, each waited for with a real readiness check and stopped by its PID.
Used by `draftgen run` and by the test fixtures.

Every process is known to the stack (and to `compose.process.CHILDREN`) from the moment it is
spawned, before its readiness wait, so `stop_all` reaches it whenever the start is interrupted.
A command wraps itself in `compose.process.interrupt_guard` for the signal handling."""

from __future__ import annotations

import contextlib
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from compose.kafka import KafkaBroker, KafkaCluster
from compose.process import (
    InterruptGuard,
    ManagedProcess,
    free_port,
    interrupt_guard,
    stop_together,
)
from compose.seaweedfs import SeaweedS3


def draftgen_argv(*args: str) -> list[str]:
    """Run the CLI with this interpreter, whatever PATH says."""
    return [sys.executable, "-m", "streams", *args]


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return bool(response.status == 200)


class LocalStack:
    """`with LocalStack(workdir) as stack:` for a command: the block runs under
    `interrupt_guard()` (first SIGINT/SIGTERM/SIGHUP → KeyboardInterrupt, a second one →
    SIGKILL of every child) and leaving it stops everything (`stop_all`, then the guard's
    own sweep for anything left). Tests may use it without `with` and call `stop_all`."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
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
        self, tokenizer_dir: str | Path, *options: str, name: str = "emulator"
    ) -> str:
        return self.start_emulator_process(tokenizer_dir, *options, name=name)[0]

    def start_emulator_process(
        self, tokenizer_dir: str | Path, *options: str, name: str = "emulator"
    ) -> tuple[str, ManagedProcess]:
        port = free_port()
        process = ManagedProcess(
            name,
            draftgen_argv(
                "emulate-server", "--tokenizer", str(tokenizer_dir), "--port", str(port), *options
            ),
            self._log(name),
        )
        self.processes.append(process)
        self._servers.add(id(process))
        process.start()
        url = f"http://127.0.0.1:{port}"
        process.wait_ready(lambda: _http_ok(f"{url}/health_generate"), timeout=120)
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
        self, name: str, args: Sequence[str], env: dict[str, str] | None = None
    ) -> ManagedProcess:
        process = ManagedProcess(name, draftgen_argv(*args), self._log(name), env=env)
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
