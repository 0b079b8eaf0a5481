"""Issue 48's partial failures of a fleet, "each costs only itself", as scenarios on the
`Fleet` of work_scenarios.py, shared by their CI test (tests/integration/test_fleet_faults.py)
and a benchmark run (`python -m tests.benchmarks.fleet_faults`, figures in BENCHMARKS.md):

- `refusing_node`: one node answers every request `404 model not found` (a wrong served
  model name) while its health checks pass;
- `crashing_prompt`: one prompt takes down any server that receives it, every server under a
  restart policy (back `restart_s` after it died);
- `skewed_clocks`: one worker's wall clock 30 s ahead, one 30 s behind (libfaketime, its
  monotonic clock left alone), no fault injected.

Each measures, from the topics and the ledger: prompts lost, dead letters by mistake,
requests redone (a prompt's claims won beyond one: each won claim is a request, and a server
that crashes logs none of the requests it cut), and the time to finish.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import threading
from collections import Counter
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import orjson

from streams.core.ledger import CLAIM, Claim
from streams.core.normalize import make_prompt_record
from streams.core.records import DeadLetter
from streams.core.settings import DEAD_LETTERS, GENERATED, KafkaSettings
from streams.core.topic_reader import TopicReader
from tests.benchmarks.work_scenarios import Fleet, FleetPlan, ScenarioResult

# the prompt that crashes servers: Fleet.publish writes "[i] Explain step i of the plan."
BOMB_INDEX = 17
BOMB_MARKER = f"step {BOMB_INDEX} of the plan"
# the refusing node's one line (streams/generate/gate.py `refusing`)
REFUSING_LINE = "fails every request for good"


def bomb_id() -> str:
    text = f"[{BOMB_INDEX}] Explain step {BOMB_INDEX} of the plan."
    return make_prompt_record({"messages": [{"role": "user", "content": text}]}, "x").prompt_id


async def _read(kafka: KafkaSettings, topic: str) -> list[tuple[bytes, bytes]]:
    reader = TopicReader(kafka, kafka.topic(topic))
    found: list[tuple[bytes, bytes]] = []
    try:
        if await reader.open():
            await reader.read_to_end(lambda r: found.append((r.key or b"", r.value or b"")))
    finally:
        await reader.close()
    return found


def dead_letters(kafka: KafkaSettings) -> dict[str, DeadLetter]:
    """The generate stage's dead letters, by prompt id."""
    letters = (DeadLetter.decode(value) for _, value in asyncio.run(_read(kafka, DEAD_LETTERS)))
    return {letter.prompt_id or "": letter for letter in letters if letter.stage == "generate"}


def requests_by_claims(kafka: KafkaSettings) -> Counter[str]:
    """How many requests each prompt had: its claims that won a hold (not renewals), by the
    ledger's rule (streams/core/ledger.py `Claim.beats`)."""
    holders: dict[str, Claim | None] = {}
    requests: Counter[str] = Counter()
    for key, value in asyncio.run(_read(kafka, GENERATED)):
        text = key.decode()
        claim = Claim.decode(value) if text.endswith(CLAIM) else None
        if claim is None:
            continue
        work = text.removesuffix(CLAIM)
        holder = holders.get(work)
        if claim.released:
            if holder is not None and holder.worker == claim.worker:
                holders[work] = None
        elif claim.beats(holder):
            if holder is None or holder.worker != claim.worker:
                requests[work.partition("@")[0]] += 1
            holders[work] = claim
    return requests


class RestartPolicy:
    """A supervisor's restart policy for the fleet's servers: one that died is started again on
    its port `restart_s` later (a model server's restart, minutes on a real fleet)."""

    def __init__(self, fleet: Fleet, restart_s: float) -> None:
        self.fleet = fleet
        self.restart_s = restart_s
        self.crashes: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def _watch(self) -> None:
        while not self._stop.is_set():
            for name, (url, process) in list(self.fleet.servers.items()):
                if process.alive():
                    continue
                self.crashes.append((self.fleet.now(), name))
                self.fleet.event(f"server {name} died; back in {self.restart_s:.0f}s")
                if self._stop.wait(self.restart_s):  # the restart's delay, not a synchronisation
                    return
                self.fleet.start_server(name, port=int(url.rsplit(":", 1)[1]))
                self.fleet.event(f"server {name} restarted")
            self._stop.wait(0.2)


def _logged_at(line: str) -> float | None:
    """The wall clock of a worker log line ("2026-12-07 15:01:02,123 ...")."""
    found = re.match(r"\[?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})", line)
    if not found:
        return None
    return datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S").timestamp() + int(found[2]) / 1000


def refusing_node(
    fleet: Fleet, victim: str = "c", finish_timeout_s: float = 120.0
) -> ScenarioResult:
    """`victim` answers 404 to every request (its plan's `node_args`). Measured: dead letters
    (all by mistake: every prompt is fine), its requests, and when its worker said so."""
    fleet.start()
    fleet.publish()
    finished = fleet.wait_done(finish_timeout_s)
    fleet.event("every prompt has an outcome" if finished else "not finished")
    log = fleet.workers[victim].log_path.read_text(errors="replace").splitlines()
    said = next((_logged_at(line) for line in log if REFUSING_LINE in line), None)
    requests = requests_by_claims(fleet.kafka)
    return fleet.result(
        "refusing node",
        measures={
            "finished_s": finished,
            "mistaken_dead_letters": len(dead_letters(fleet.kafka)),
            "requests_to_refusing_node": _requests_of(fleet, victim),
            "redone": sum(n - 1 for n in requests.values() if n > 1),
            "refusing_shown_after_s": None if said is None else said - fleet.published_at,
        },
    )


def _requests_of(fleet: Fleet, name: str) -> int:
    """Requests `name`'s server logged (a refused one too)."""
    path = fleet.request_log(name)
    return len(path.read_bytes().splitlines()) if path.exists() else 0


def crashing_prompt(
    fleet: Fleet, restart_s: float = 3.0, finish_timeout_s: float = 180.0
) -> ScenarioResult:
    """Every server crashes on BOMB_MARKER (its plan's `server_args`) and is restarted after
    `restart_s`. Measured: crashes, the bomb's outcome, requests redone of the others."""
    policy = RestartPolicy(fleet, restart_s)
    fleet.start()
    policy.start()
    fleet.publish()
    try:
        finished = fleet.wait_done(finish_timeout_s)
    finally:
        policy.stop()
    fleet.event("every prompt has an outcome" if finished else "not finished")
    bomb = bomb_id()
    letters = dead_letters(fleet.kafka)
    requests = requests_by_claims(fleet.kafka)
    innocents = {p: n for p, n in requests.items() if p != bomb}
    letter = letters.get(bomb)
    return fleet.result(
        "crashing prompt",
        measures={
            "finished_s": finished,
            "crashes": len(policy.crashes),
            "bomb": f"{letter.kind}: {letter.message}" if letter else "no dead letter",
            "bomb_requests": requests[bomb],
            "mistaken_dead_letters": len([p for p in letters if p != bomb]),
            "innocents_redone": sum(1 for n in innocents.values() if n > 1),
            "most_requests_of_an_innocent": max(innocents.values(), default=0),
        },
    )


def skewed_clocks(fleet: Fleet, finish_timeout_s: float = 180.0) -> ScenarioResult:
    """Workers whose clocks disagree (its plan's `worker_env`), no fault: measured, prompts
    requested more than once and requests of a prompt overlapping on two servers."""
    fleet.start()
    fleet.publish()
    finished = fleet.wait_done(finish_timeout_s)
    fleet.event("every prompt has an outcome" if finished else "not finished")
    return fleet.result("skewed clocks", measures={"finished_s": finished})


def skew(seconds: str, lib: str) -> tuple[tuple[str, str], ...]:
    """The environment that moves a process's wall clock (not its monotonic one)."""
    return (
        ("LD_PRELOAD", lib),
        ("FAKETIME", seconds),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ("FAKETIME_DONT_RESET", "1"),  # its children (none) would keep the offset
    )


def plans(servers: int, prompts: int, faketime: str = "") -> dict[str, FleetPlan]:
    base = FleetPlan(servers=servers, prompts=prompts)
    found = {
        "refusing": replace(base, node_args=(("c", ("--refuse-all", "404")),)),
        "crash": replace(base, server_args=("--crash-on", BOMB_MARKER)),
    }
    if faketime:  # answers of 1.6-6.4 s: claims renewed, thieves at work at the end
        found["skew"] = replace(
            base,
            tokens_per_s=40.0,
            min_output_tokens=64,
            max_output_tokens=256,
            worker_env=(("a", skew("+30s", faketime)), ("b", skew("-30s", faketime))),
        )
    return found


def main() -> int:  # pragma: no cover - a benchmark run, minutes long
    from compose.stack import LocalStack
    from compose.tiny_tokenizers import build_qwen36_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=600)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/draftgen-fleet-faults"))
    parser.add_argument("--faketime", default="", help="libfaketime.so.1: the skewed-clock run")
    args = parser.parse_args()
    work = args.workdir
    with LocalStack(work / "stack") as stack:
        bootstrap = stack.start_kafka()
        tokenizer = build_qwen36_tokenizer(work / "tokenizer")
        for name, plan in plans(args.servers, args.prompts, args.faketime).items():
            kafka = KafkaSettings(
                bootstrap=bootstrap, topic_prefix=f"{name}-", partitions=plan.partitions
            )
            fleet = Fleet(stack, kafka, tokenizer, work / name, plan, say=print)
            scenario = {"refusing": refusing_node, "crash": crashing_prompt}.get(
                name, skewed_clocks
            )
            try:
                result = scenario(fleet)
            finally:
                fleet.stop()
            print(result.report())
            print(orjson.dumps(result.as_json()).decode(), flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
