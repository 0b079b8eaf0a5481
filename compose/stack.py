"""The one launcher API: Kafka, SeaweedFS, emulated servers and pipeline workers as child
processes of ours, each waited for with a real readiness check and stopped by its PID.
Used by `draftgen run` and by the test fixtures."""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from compose.kafka import KafkaBroker
from compose.process import ManagedProcess, free_port
from compose.seaweedfs import SeaweedS3


def draftgen_argv(*args: str) -> list[str]:
    """Run the CLI with this interpreter, whatever PATH says."""
    return [sys.executable, "-m", "streams", *args]


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return bool(response.status == 200)


class LocalStack:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kafka: KafkaBroker | None = None
        self.s3: SeaweedS3 | None = None
        self.processes: list[ManagedProcess] = []
        self._names: dict[str, int] = {}

    def _log(self, name: str) -> Path:
        count = self._names[name] = self._names.get(name, 0) + 1
        return self.workdir / "logs" / f"{name}-{count}.log"

    # -- infrastructure ----------------------------------------------------------------------

    def start_kafka(self) -> str:
        self.kafka = KafkaBroker(self.workdir / "kafka").start()
        return self.kafka.bootstrap

    def start_s3(self) -> SeaweedS3:
        self.s3 = SeaweedS3(self.workdir / "s3").start()
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
        ).start()
        self.processes.append(process)
        url = f"http://127.0.0.1:{port}"
        process.wait_ready(lambda: _http_ok(f"{url}/health_generate"), timeout=120)
        return url, process

    def restart(self, process: ManagedProcess) -> ManagedProcess:
        """Respawn a stopped or killed process of ours; the new one is tracked instead."""
        process.stop()
        fresh = process.respawn()
        self.processes[self.processes.index(process)] = fresh
        return fresh

    # -- pipeline workers --------------------------------------------------------------------

    def start_worker(
        self, name: str, args: Sequence[str], env: dict[str, str] | None = None
    ) -> ManagedProcess:
        process = ManagedProcess(name, draftgen_argv(*args), self._log(name), env=env).start()
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        # Workers first, so they do not spend their last moments retrying a vanished broker.
        for process in reversed(self.processes):
            process.stop()
        if self.kafka:
            self.kafka.stop()
        if self.s3:
            self.s3.stop()
