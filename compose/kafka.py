"""Apache Kafka 4.x in KRaft mode, from Maven Central jars, started with the local Java 17: a
single node (`KafkaBroker`, what `draftgen run` and the tests use) or a cluster of combined
broker+controller nodes on loopback (`KafkaCluster`, three by default) to try replication."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from compose.process import (
    ManagedProcess,
    ServiceError,
    free_port,
    port_open,
    run_tracked,
    stop_together,
)

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
    """A combined broker+controller on free loopback ports, data in `workdir`. Alone it is a
    one-node cluster; `KafkaCluster` makes several of them one cluster."""

    def __init__(
        self,
        workdir: Path,
        version: str = KAFKA_VERSION,
        *,
        node_id: int = 1,
        heap: str = "768m",
    ):
        self.workdir = workdir
        self.version = version
        self.node_id = node_id
        self.name = "kafka"
        self.heap = heap
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        # a cluster's nodes share these (KafkaCluster sets them before the first start)
        self.voters = f"{node_id}@127.0.0.1:{self.controller_port}"
        self.cluster_id: str | None = None
        self.overrides: dict[str, str] = {}
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
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters,
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
            **self.overrides,
        }
        path = self.workdir / name
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.workdir / "log4j2.xml").write_text(_LOG4J2)
        return path

    def _java(self, main: str, *args: str, tool: bool = False) -> list[str]:
        if tool:  # a second's run (the format): the quick JIT tier alone, the simple
            # collector; a third of the CPU the broker's settings spend on it
            flags = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
        else:
            flags = ["-Xms256m", f"-Xmx{self.heap}", "-XX:+UseG1GC"]
        return [
            java_binary(),
            *flags,
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.xml'}",
            "-cp",
            kafka_classpath(self.version),
            main,
            *args,
        ]

    def start(self, timeout: float = 90.0) -> KafkaBroker:
        self.launch()
        self.wait_ready(timeout)
        return self

    def launch(self) -> None:
        """Format the log directory if new, and spawn the node without waiting for it (the
        nodes of a cluster answer only once a majority of them runs)."""
        self.prepare()
        self.spawn()

    def prepare(self) -> None:
        """The configuration, and the log directory formatted if new."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        if not (self.log_dirs / "meta.properties").exists():
            self._format()

    def spawn(self) -> None:
        """Start the node (from the main thread, so it dies with us: see compose/process.py)."""
        self._process = ManagedProcess(
            self.name,
            self._java("kafka.Kafka", str(self.workdir / "server.properties")),
            self.workdir / "kafka.log",
        )
        self._process.start()

    def wait_ready(self, timeout: float = 90.0) -> None:
        assert self._process is not None
        self._process.wait_ready(self._ready, timeout)  # stops the node if it never gets ready

    def _format(self) -> None:
        """Format the log directory aside and move it in place only when complete: a format
        interrupted at any point leaves nothing a re-run would trip on."""
        staging = self.workdir / "kraft-logs.formatting"
        for stale in (staging, self.log_dirs):  # never formatted, so holds no data
            shutil.rmtree(stale, ignore_errors=True)
        config = self._write_config(staging, name="format.properties")
        cluster_id = self.cluster_id or random_cluster_id()
        argv = self._java(
            "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config), tool=True
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

    def kill(self) -> None:
        """SIGKILL, as a crash or a lost machine would (for fault tests)."""
        if self._process:
            self._process.kill()

    def restart(self, timeout: float = 90.0) -> None:
        """Start again on the same ports and log directory (after `stop`, for outage tests)."""
        self.start(timeout)


class KafkaCluster:
    """`size` combined broker+controller nodes on loopback, one KRaft quorum of all of them
    (a majority keeps it running), each with its own ports and log directory under `workdir`.
    Internal topics get min(3, size) replicas; `min_insync` and `replication` are the
    brokers' defaults for topics created without their own."""

    def __init__(
        self,
        workdir: Path,
        size: int = 3,
        *,
        min_insync: int = 2,
        replication: int | None = None,
        version: str = KAFKA_VERSION,
        heap: str = "512m",
    ):
        if size < 1:
            raise ValueError("a cluster has at least one node")
        self.workdir = workdir
        self.nodes = [
            KafkaBroker(workdir / f"node-{i}", version, node_id=i, heap=heap)
            for i in range(1, size + 1)
        ]
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        cluster_id = random_cluster_id()
        internal = str(min(3, size))
        internal_isr = str(min(min_insync, min(3, size)))
        for node in self.nodes:
            node.name = f"kafka-{node.node_id}"
            node.voters = voters
            node.cluster_id = cluster_id
            node.overrides = {
                "offsets.topic.replication.factor": internal,
                "transaction.state.log.replication.factor": internal,
                "transaction.state.log.min.isr": internal_isr,
                "share.coordinator.state.topic.replication.factor": internal,
                "share.coordinator.state.topic.min.isr": internal_isr,
                "default.replication.factor": str(replication or min(3, size)),
                "min.insync.replicas": str(min_insync),
            }
        self.bootstrap = ",".join(node.bootstrap for node in self.nodes)

    @property
    def processes(self) -> list[ManagedProcess]:
        return [node.process for node in self.nodes if node.process is not None]

    def start(self, timeout: float = 120.0) -> KafkaCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            # formatting is a JVM start per node: side by side
            with ThreadPoolExecutor(len(self.nodes)) as pool:
                list(pool.map(lambda node: node.prepare(), self.nodes))
            for node in self.nodes:
                node.spawn()
            for node in self.nodes:
                node.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        stop_together(self.processes, grace=20)


async def _describe_cluster(bootstrap: str) -> bool:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    try:
        await admin.start()
        await admin.list_topics()
        return True
    finally:
        await admin.close()


def main(argv: list[str] | None = None) -> int:
    """`python -m compose.kafka --brokers 3`: a local cluster to try replication with; prints
    its bootstrap servers and runs until Ctrl-C (then stops every node it started)."""
    import argparse
    import sys
    import tempfile
    import time

    from compose.process import interrupt_guard

    parser = argparse.ArgumentParser(prog="python -m compose.kafka", description=main.__doc__)
    parser.add_argument("--brokers", type=int, default=3, help="nodes (default 3)")
    parser.add_argument("--min-insync", type=int, default=None, help="default: brokers - 1")
    parser.add_argument("--workdir", type=Path, help="logs and data (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.brokers < 1:
        parser.error("--brokers must be at least 1")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="draftgen-kafka-"))
    min_insync = args.min_insync or max(1, min(3, args.brokers) - 1)
    with interrupt_guard():
        cluster = KafkaCluster(workdir, args.brokers, min_insync=min_insync)
        try:
            cluster.start()
            print(f"bootstrap: {cluster.bootstrap}  (data and logs in {workdir})", flush=True)
            print("Ctrl-C stops it", file=sys.stderr, flush=True)
            while all(p.alive() for p in cluster.processes):
                time.sleep(1)
            print("a node exited; stopping the others", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        except ServiceError as err:
            print(f"compose.kafka: {err}", file=sys.stderr)
            return 1
        finally:
            cluster.stop()


if __name__ == "__main__":
    raise SystemExit(main())
