"""Apache Kafka 4.x, single node KRaft, from Maven Central jars, started with the local Java 17."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import subprocess
import uuid
from pathlib import Path

from compose.process import ManagedProcess, ServiceError, free_port, port_open, run_tracked

KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.25.3"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>draftgen</groupId><artifactId>kafka-runtime</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId>
      <version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j2-impl</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

_LOG4J2 = """<Configuration status="warn">
  <Appenders><Console name="out" target="SYSTEM_OUT">
    <PatternLayout pattern="[%d] %p %c{1} %m%n"/></Console></Appenders>
  <Loggers><Root level="warn"><AppenderRef ref="out"/></Root>
    <Logger name="kafka.server.KafkaRaftServer" level="info"/></Loggers>
</Configuration>
"""


def cache_dir() -> Path:
    base = os.environ.get("DRAFTGEN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "draftgen"
    )
    return Path(base)


def kafka_classpath(version: str = KAFKA_VERSION) -> str:
    """Resolve the broker's jars once with Maven and cache them; returns a java classpath."""
    home = cache_dir() / f"kafka-{version}"
    libs = home / "libs"
    done = home / ".complete"
    if not done.exists():
        if not shutil.which("mvn"):
            raise ServiceError(
                "Maven (`mvn`) is needed once to fetch Kafka's jars from Maven Central"
            )
        home.mkdir(parents=True, exist_ok=True)
        (home / "pom.xml").write_text(_POM.format(kafka=version, log4j=LOG4J_VERSION))
        try:
            run_tracked(
                "mvn",
                [
                    "mvn",
                    "-q",
                    "-B",
                    "-f",
                    str(home / "pom.xml"),
                    "dependency:copy-dependencies",
                    f"-DoutputDirectory={libs}",
                ],
            )
        except subprocess.CalledProcessError as err:
            raise ServiceError(
                f"fetching Kafka {version} jars failed:\n{err.stdout[-2000:]}"
            ) from None
        done.touch()
    return f"{libs}/*"


def random_cluster_id() -> str:
    """What `kafka-storage random-uuid` prints (Kafka's Uuid: url-safe base64, no padding,
    never starting with '-'), without starting a JVM for it."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def java_binary() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and Path(java_home, "bin", "java").exists():
        return str(Path(java_home, "bin", "java"))
    found = shutil.which("java")
    if not found:
        raise ServiceError("Java 17 is needed to run Kafka")
    return found


class KafkaBroker:
    """A combined broker+controller on free loopback ports, data in `workdir`."""

    def __init__(self, workdir: Path, version: str = KAFKA_VERSION):
        self.workdir = workdir
        self.version = version
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._process: ManagedProcess | None = None

    @property
    def process(self) -> ManagedProcess | None:
        return self._process

    @property
    def log_dirs(self) -> Path:
        return self.workdir / "kraft-logs"

    def _write_config(self, log_dirs: Path | None = None, name: str = "server.properties") -> Path:
        logs = log_dirs or self.log_dirs
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(logs),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "message.max.bytes": str(8 * 1024 * 1024),
            "log.retention.hours": "-1",
        }
        path = self.workdir / name
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.workdir / "log4j2.xml").write_text(_LOG4J2)
        return path

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            java_binary(),
            "-Xms256m",
            "-Xmx768m",
            "-XX:+UseG1GC",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.xml'}",
            "-cp",
            kafka_classpath(self.version),
            main,
            *args,
        ]

    def start(self, timeout: float = 90.0) -> KafkaBroker:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        if not (self.log_dirs / "meta.properties").exists():
            self._format()
        self._process = ManagedProcess(
            "kafka", self._java("kafka.Kafka", str(config)), self.workdir / "kafka.log"
        )
        self._process.start()
        self._process.wait_ready(self._ready, timeout)  # stops the broker if it never gets ready
        return self

    def _format(self) -> None:
        """Format the log directory aside and move it in place only when complete: a format
        interrupted at any point leaves nothing a re-run would trip on."""
        staging = self.workdir / "kraft-logs.formatting"
        for stale in (staging, self.log_dirs):  # never formatted, so holds no data
            shutil.rmtree(stale, ignore_errors=True)
        config = self._write_config(staging, name="format.properties")
        argv = self._java(
            "kafka.tools.StorageTool", "format", "-t", random_cluster_id(), "-c", str(config)
        )
        try:
            run_tracked("kafka-storage-format", argv)
        except subprocess.CalledProcessError as err:
            raise ServiceError(
                f"formatting {self.log_dirs} failed:\n{err.stdout}{err.stderr}"
            ) from None
        staging.rename(self.log_dirs)

    def _ready(self) -> bool:
        # The port opens before the broker can answer; ask it only once it listens.
        return port_open("127.0.0.1", self.port) and asyncio.run(_describe_cluster(self.bootstrap))

    def stop(self) -> None:
        if self._process:
            self._process.stop(grace=20)

    def restart(self, timeout: float = 90.0) -> None:
        """Start again on the same ports and log directory (after `stop`, for outage tests)."""
        self.start(timeout)


async def _describe_cluster(bootstrap: str) -> bool:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    try:
        await admin.start()
        await admin.list_topics()
        return True
    finally:
        await admin.close()
