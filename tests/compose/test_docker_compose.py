"""compose/docker-compose.yml, parsed as YAML (no Docker needed): the services, one generate
worker per listed server, the optional SGLang profile with GPU reservations, Kafka in KRaft
mode; and the committed file is exactly what compose/servers.txt renders to."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from compose.render_compose import parse_servers, render
from streams.cli.flags import build
from streams.cli.main import build_parser
from streams.core.settings import ObserveSettings

COMPOSE = Path(__file__).resolve().parents[2] / "compose"


def load(text: str) -> dict[str, Any]:
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def interpolate(value: str) -> str:
    """Compose's ${VAR:-default} with an empty environment: the defaults."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", value)


def command(service: dict[str, Any]) -> list[str]:
    raw = service["command"]
    return [interpolate(str(a)) for a in (shlex.split(raw) if isinstance(raw, str) else raw)]


def generate_workers(services: dict[str, Any]) -> dict[str, list[str]]:
    """worker service name -> its --server URL"""
    found = {}
    for name, service in services.items():
        argv = command(service) if "command" in service else []
        if argv[:2] == ["worker", "generate"]:
            found[name] = argv[argv.index("--server") + 1]
    return found


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    return load((COMPOSE / "docker-compose.yml").read_text())


def test_committed_file_is_the_rendering_of_the_server_list() -> None:
    servers = parse_servers((COMPOSE / "servers.txt").read_text())
    assert (COMPOSE / "docker-compose.yml").read_text() == render(servers), (
        "run: python -m compose.render_compose compose/servers.txt > compose/docker-compose.yml"
    )


def test_infrastructure_and_the_tokenize_worker(committed: dict[str, Any]) -> None:
    services = committed["services"]
    assert {"kafka", "s3", "s3-init", "tokenize"} <= set(services)
    tokenize = command(services["tokenize"])
    assert tokenize[:2] == ["worker", "tokenize"]
    assert "--tokenizer-dir" in tokenize and "--out" in tokenize and "--dataset" in tokenize
    assert services["tokenize"]["depends_on"]["s3-init"]["condition"] == (
        "service_completed_successfully"
    )
    assert "seaweedfs" in services["s3"]["image"]
    assert "-s3" in command(services["s3"])
    # pipeline services never sit in a profile: `docker compose up` starts them all
    for name in ("kafka", "s3", "s3-init", "tokenize", *generate_workers(services)):
        assert "profiles" not in services[name], name


def test_kafka_runs_in_kraft_mode(committed: dict[str, Any]) -> None:
    kafka = committed["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:4.")
    env = {k: interpolate(str(v)) for k, v in kafka["environment"].items()}
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    assert "CONTROLLER" in env["KAFKA_LISTENERS"] and env["CLUSTER_ID"]
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert not any("ZOOKEEPER" in key for key in env)
    assert not any("zookeeper" in name for name in committed["services"])


def test_one_generate_worker_per_listed_server(committed: dict[str, Any]) -> None:
    servers = parse_servers((COMPOSE / "servers.txt").read_text())
    workers = generate_workers(committed["services"])
    assert workers == {f"generate-{s.name}": s.url for s in servers}


def test_sglang_services_are_an_optional_profile_with_gpu_reservations(
    committed: dict[str, Any],
) -> None:
    services = committed["services"]
    for server in parse_servers((COMPOSE / "servers.txt").read_text()):
        if not server.local:
            continue
        sglang = services[f"sglang-{server.name}"]
        assert sglang["profiles"] == ["sglang"]
        (device,) = sglang["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert device["device_ids"] == list(server.gpus)
        argv = command(sglang)
        assert argv[argv.index("--tp") + 1] == str(len(server.gpus))
        assert server.url == f"http://sglang-{server.name}:{argv[argv.index('--port') + 1]}"
        # a worker does not wait on a service that may be outside the active profiles
        assert f"sglang-{server.name}" not in services[f"generate-{server.name}"].get(
            "depends_on", {}
        )


def test_every_worker_command_is_one_the_cli_accepts(committed: dict[str, Any]) -> None:
    parser = build_parser()
    for name, service in committed["services"].items():
        argv = command(service) if "command" in service else []
        if argv[:1] == ["worker"]:
            observe = build(ObserveSettings, parser.parse_args(argv))
            assert observe.metrics_port == 9100 and observe.metrics_host == "0.0.0.0", name


def test_scaling_is_editing_the_list() -> None:
    servers = parse_servers(
        """
        # two GPUs here, one tensor-parallel server of four, and one remote server
        a gpus=0
        b gpus=1 concurrency=32
        big gpus=2,3,4,5
        far http://gpu-07.example:30000/  # trailing slash dropped
        """
    )
    services = load(render(servers))["services"]
    assert generate_workers(services) == {
        "generate-a": "http://sglang-a:30000",
        "generate-b": "http://sglang-b:30000",
        "generate-big": "http://sglang-big:30000",
        "generate-far": "http://gpu-07.example:30000",
    }
    assert sorted(n for n in services if n.startswith("sglang-")) == [
        "sglang-a",
        "sglang-b",
        "sglang-big",
    ]
    big = services["sglang-big"]
    assert big["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == [
        "2",
        "3",
        "4",
        "5",
    ]
    b = command(services["generate-b"])
    assert b[b.index("--concurrency") + 1] == "32"
    sglang_b = command(services["sglang-b"])
    assert sglang_b[sglang_b.index("--max-running-requests") + 1] == "32"


def test_concurrency_auto_lets_sglang_size_its_batch() -> None:
    servers = parse_servers("a gpus=0 concurrency=auto\nfar http://x:1 concurrency=auto")
    services = load(render(servers))["services"]
    for name in ("generate-a", "generate-far"):
        worker = command(services[name])
        assert worker[worker.index("--concurrency") + 1] == "auto"
    assert "--max-running-requests" not in command(services["sglang-a"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no servers"),
        ("a gpus=0\na gpus=1", "unique"),
        ("a", "either a URL or gpus="),
        ("a http://x:1 gpus=0", "either a URL or gpus="),
        ("A gpus=0", "lowercase"),
        ("a gpus=x", "device ids"),
        ("a gpus=0 speed=9", "unknown field"),
        ("ok gpus=0\nb gpus=1 concurrency=0", "line 2"),
        ("a gpus=0 concurrency=lots", "positive integer or auto"),
    ],
)
def test_bad_server_lists_are_refused_with_the_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_servers(text)


@pytest.fixture(scope="module")
def cluster_file() -> dict[str, Any]:
    return load((COMPOSE / "docker-compose.cluster.yml").read_text())


def test_committed_cluster_file_is_the_rendering_with_three_brokers() -> None:
    servers = parse_servers((COMPOSE / "servers.txt").read_text())
    assert (COMPOSE / "docker-compose.cluster.yml").read_text() == render(servers, brokers=3), (
        "run: python -m compose.render_compose --brokers 3 compose/servers.txt "
        "> compose/docker-compose.cluster.yml"
    )


def test_the_cluster_option_is_three_replicating_kraft_nodes(cluster_file: dict[str, Any]) -> None:
    services = cluster_file["services"]
    nodes = ["kafka", "kafka-2", "kafka-3"]
    envs = [{k: interpolate(str(v)) for k, v in services[n]["environment"].items()} for n in nodes]
    voters = "1@kafka:9093,2@kafka-2:9093,3@kafka-3:9093"
    assert [env["KAFKA_NODE_ID"] for env in envs] == ["1", "2", "3"]
    assert len({env["CLUSTER_ID"] for env in envs}) == 1
    for name, env in zip(nodes, envs, strict=True):
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == voters
        assert f"DOCKER://{name}:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3"
    assert {services[n]["volumes"][0].split(":")[0] for n in nodes} == {f"{n}-data" for n in nodes}
    assert {f"{n}-data" for n in nodes} <= set(cluster_file["volumes"])
    # every worker knows every broker, waits for all of them and asks for three replicas
    parser = build_parser()
    workers = [n for n, s in services.items() if "command" in s and command(s)[:1] == ["worker"]]
    assert "tokenize" in workers and len(workers) > 1
    for name in workers:
        argv = command(services[name])
        assert argv[argv.index("--bootstrap") + 1] == "kafka:9092,kafka-2:9092,kafka-3:9092"
        assert set(nodes) <= set(services[name]["depends_on"]), name
        parser.parse_args(argv)
    replication = services["tokenize"]["environment"]["DRAFTGEN_KAFKA_REPLICATION_FACTOR"]
    assert interpolate(str(replication)) == "3"
    # the single-broker file stays as it was: no replication asked, one node
    single = load((COMPOSE / "docker-compose.yml").read_text())["services"]
    assert "kafka-2" not in single
    assert "DRAFTGEN_KAFKA_REPLICATION_FACTOR" not in single["tokenize"]["environment"]
