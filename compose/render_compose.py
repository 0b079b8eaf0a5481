"""Render compose/docker-compose.yml from a list of SGLang servers (compose/servers.txt).

Compose has no loops, so "one generate worker per server" cannot be a static file that scales
by editing a list; this renders one instead. Scaling is editing servers.txt and running

    python -m compose.render_compose compose/servers.txt > compose/docker-compose.yml

and, for the three-broker variant (replicated topics: a lost broker loses nothing),

    python -m compose.render_compose --brokers 3 compose/servers.txt \
        > compose/docker-compose.cluster.yml

servers.txt: one server per line, `#` comments.

    NAME URL [concurrency=N]          a server that runs elsewhere: only its worker runs here
    NAME gpus=IDS [concurrency=N]     an SGLang service `sglang-NAME` here too (profile
                                      `sglang`), on the GPUs IDS (e.g. 0 or 0,1,2,3: --tp 4)

concurrency=auto: the worker keeps the server's own running cap in flight (read from its
/server_info), and a local SGLang service is started without --max-running-requests.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from compose.compose_templates import (
    FOOTER,
    GENERATE,
    HEADER,
    KAFKA_NODE,
    KAFKA_SINGLE,
    SGLANG,
)

SGLANG_PORT = 30000
METRICS_PORT = 9100
# how each committed file is rendered (a test checks that they are)
RENDER_ARGS = {
    False: "compose/servers.txt > compose/docker-compose.yml",
    True: "--brokers 3 compose/servers.txt > compose/docker-compose.cluster.yml",
}
KAFKA_HOST_PORT = 29092  # the first broker's port on the host; the others follow
DEFAULT_CONCURRENCY = 64
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")


@dataclass(frozen=True)
class Server:
    name: str
    url: str
    gpus: tuple[str, ...] = ()  # non-empty: an SGLang service is run here
    concurrency: int | Literal["auto"] = DEFAULT_CONCURRENCY

    @property
    def local(self) -> bool:
        return bool(self.gpus)


def parse_servers(text: str) -> list[Server]:
    servers: list[Server] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            servers.append(_parse_line(line))
        except ValueError as err:
            raise ValueError(f"servers line {number}: {err}: {raw.strip()!r}") from None
    names = [s.name for s in servers]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"server names must be unique: {', '.join(duplicates)}")
    if not servers:
        raise ValueError("no servers listed")
    return servers


def _parse_line(line: str) -> Server:
    name, *fields = line.split()
    if not _NAME.match(name):
        raise ValueError("a name is lowercase letters, digits and dashes")
    url = ""
    concurrency: int | Literal["auto"] = DEFAULT_CONCURRENCY
    gpus: tuple[str, ...] = ()
    for item in fields:
        if item.startswith(("http://", "https://")) and not url:
            url = item.rstrip("/")
        elif item.startswith("gpus="):
            gpus = tuple(g for g in item.removeprefix("gpus=").split(",") if g)
            if not gpus or not all(g.isdigit() for g in gpus):
                raise ValueError("gpus= takes device ids, e.g. gpus=0,1")
        elif item.startswith("concurrency="):
            value = item.removeprefix("concurrency=")
            if value == "auto":
                concurrency = "auto"
            elif value.isdigit() and int(value) > 0:
                concurrency = int(value)
            else:
                raise ValueError("concurrency= takes a positive integer or auto")
        else:
            raise ValueError(f"unknown field {item!r}")
    if bool(url) == bool(gpus):
        raise ValueError("give either a URL or gpus=, not both")
    return Server(name, url or f"http://sglang-{name}:{SGLANG_PORT}", gpus, concurrency)


def _max_running(concurrency: int | Literal["auto"]) -> str:
    """SGLang's cap on the running batch; with auto, SGLang sizes it and the worker reads it."""
    if concurrency == "auto":
        return ""
    return f'      - --max-running-requests\n      - "{concurrency}"\n'


def kafka_services(brokers: int) -> list[str]:
    """The Kafka services' names: `kafka`, then `kafka-2`, `kafka-3`, …"""
    return ["kafka", *(f"kafka-{node}" for node in range(2, brokers + 1))]


def _kafka(brokers: int) -> str:
    if brokers == 1:
        return KAFKA_SINGLE.format()
    names = kafka_services(brokers)
    replicas = min(3, brokers)
    voters = ",".join(f"{node}@{name}:9093" for node, name in enumerate(names, start=1))
    return "".join(
        KAFKA_NODE.format(
            service=name,
            node=node,
            brokers=brokers,
            voters=voters,
            host_port=KAFKA_HOST_PORT + node - 1,
            replicas=replicas,
            min_isr=max(1, replicas - 1),
        )
        for node, name in enumerate(names, start=1)
    )


def _healthy(names: list[str], indent: str) -> str:
    return "".join(f"{indent}{name}:\n{indent}  condition: service_healthy\n" for name in names)


def render(servers: list[Server], brokers: int = 1) -> str:
    """The compose file: one generate worker per server, on `brokers` Kafka nodes (one, or a
    cluster whose topics keep min(3, brokers) copies; the workers wait for every node and ask
    for that many replicas, so no topic is created with fewer while a node still starts)."""
    if brokers < 1:
        raise ValueError("at least one Kafka broker")
    names = kafka_services(brokers)
    bootstrap = ",".join(f"{name}:9092" for name in names)
    replication_env = ""
    if brokers > 1:
        replication_env = (
            "    DRAFTGEN_KAFKA_REPLICATION_FACTOR: "
            f"${{DRAFTGEN_KAFKA_REPLICATION_FACTOR:-{min(3, brokers)}}}\n"
        )
    parts = [
        HEADER.format(
            kafka=_kafka(brokers),
            bootstrap=bootstrap,
            replication_env=replication_env,
            kafka_healthy=_healthy(names, "    "),
            kafka_healthy_tokenize=_healthy(names, "      "),
            render_args=RENDER_ARGS[brokers > 1],
        )
    ]
    for server in servers:
        parts.append(
            GENERATE.format(
                name=server.name,
                url=server.url,
                concurrency=server.concurrency,
                bootstrap=bootstrap,
            )
        )
        if server.local:
            parts.append(
                SGLANG.format(
                    name=server.name,
                    tp=len(server.gpus),
                    max_running=_max_running(server.concurrency),
                    device_ids=", ".join(f'"{g}"' for g in server.gpus),
                )
            )
    volumes = "".join(f"  {name}-data:\n" for name in names)
    parts.append(FOOTER.replace("  kafka-data:\n", volumes))
    return "".join(parts)


USAGE = "usage: python -m compose.render_compose [--brokers N] SERVERS.txt > FILE.yml"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    brokers = 1
    if args[:1] == ["--brokers"]:
        if len(args) < 2 or not args[1].isdigit() or int(args[1]) < 1:
            print(f"render_compose: --brokers takes a positive integer\n{USAGE}", file=sys.stderr)
            return 2
        brokers, args = int(args[1]), args[2:]
    if len(args) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        servers = parse_servers(Path(args[0]).read_text())
    except (OSError, ValueError) as err:
        print(f"render_compose: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(render(servers, brokers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
