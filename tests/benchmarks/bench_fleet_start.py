"""How fast a fleet of generate workers started together is in the group and requesting.

    flock /tmp/draftgen-heavy.lock .venv/bin/python tests/benchmarks/bench_fleet_start.py \
        [--workers 1,4,8] [--repeats 2] [--forked] [--json out.json] [-- extra worker flags]

Starts its own Kafka broker and max(N) emulated SGLang servers (one process each, each with a
request log), then per fleet size N and repeat: a new group and topics, N x `--per-server`
prompts published first, then N generate workers (one per server) spawned together. The clock
of each run starts at the first spawn. Per worker, from its log (`--log-level INFO`, faust's
timestamps) and its server's request log:

- started: its first log line (the interpreter has imported the CLI and faust's worker is
  starting: Python start-up and imports are before it);
- joined: its consumer subscribed, so sent its first JoinGroup (faust's recovery service
  starts then, after the table manager's 1 s wait for late tables);
- assigned: the assignment of the group's last generation reached it (faust's "generation
  id G" at each assignment);
- requested: its server received the first of the published prompts.

The fleet: all assigned (the last worker's last assignment), all requesting (the last
server's first prompt request), and the group's part of it: from the last worker's start
(the last JoinGroup sent) to all assigned. Rebalances: generations the group went through
before the benchmark stopped the workers (the "generation id G" of any worker's log).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from aiokafka import AIOKafkaProducer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from compose.emulator.request_log import prompt_digest
from compose.process import ManagedProcess
from compose.stack import LocalStack
from compose.tiny_tokenizers import build_qwen36_tokenizer
from compose.zygote import zygote
from streams.core.normalize import prompt_id
from streams.core.records import PromptRecord
from streams.core.settings import GENERATE_GROUP, PROMPTS, KafkaSettings
from streams.core.topics import ensure_topics
from tests.benchmarks.proc import cpu_s
from tests.benchmarks.workers import generate_argv
from tests.integration.probes import stable_members

# faust's log line: "[2026-12-03 10:41:02,123] [4242] [INFO] ..."
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
# faust's table manager starts its recovery service as the consumer subscribes: the JoinGroup
SUBSCRIBED = "[^---Recovery]: Starting..."
# faust's recovery service, at each assignment the consumer receives
ASSIGNED = re.compile(r"generation id (\d+) app consumers id")


def _stamp(line: str) -> float | None:
    found = STAMP.match(line)
    if not found:
        return None
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


@dataclass
class WorkerTimes:
    """Seconds from the run's first spawn."""

    spawned: float
    started: float | None = None
    joined: float | None = None
    assigned: float | None = None
    requested: float | None = None
    cpu_s: float = 0.0
    generations: list[int] = field(default_factory=list)


@dataclass
class RunResult:
    workers: int
    repeat: int
    all_assigned: float
    all_requesting: float
    last_started: float
    group_part: float  # last JoinGroup sent -> all assigned
    rebalances: int
    per_worker: list[WorkerTimes]


def read_worker_log(path: Path, t0: float, until: float, times: WorkerTimes) -> None:
    """Fill `times` from a worker's log up to `until` (when the benchmark stopped the fleet):
    its first line, its subscription, its last assignment and the generations it saw."""
    for line in path.read_text(errors="replace").splitlines():
        at = _stamp(line)
        if at is None or at > until:
            continue
        if times.started is None:
            times.started = at - t0
        if SUBSCRIBED in line and times.joined is None:
            times.joined = at - t0
        if (assigned := ASSIGNED.search(line)) is not None:
            times.assigned = at - t0
            times.generations.append(int(assigned.group(1)))


def first_prompt_request(log: Path, digests: set[str]) -> float | None:
    """Wall time of the first request for one of `digests` in an emulator's request log."""
    starts = []
    if log.exists():
        for line in log.read_text(errors="replace").splitlines():
            entry = json.loads(line)
            if entry.get("prompt") in digests:
                starts.append(float(entry["start"]))
    return min(starts) if starts else None


def _prompts(count: int, label: str) -> tuple[list[tuple[bytes, bytes]], set[str]]:
    records, digests = [], set()
    for index in range(count):
        messages = [{"role": "user", "content": f"{label} prompt {index}: explain fleets"}]
        pid = prompt_id(messages, None)
        records.append((pid.encode(), PromptRecord(pid, messages, source="bench").encode()))
        digests.add(prompt_digest(messages))
    return records, digests


async def _publish(kafka: KafkaSettings, records: list[tuple[bytes, bytes]]) -> None:
    # retried NotLeader answers on the just-created topic are routine
    logging.getLogger("aiokafka.producer.sender").setLevel(logging.ERROR)
    producer = AIOKafkaProducer(**kafka.aiokafka_kwargs(), acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send(kafka.topic(PROMPTS), key=key, value=value)
        await producer.flush()
    finally:
        await producer.stop()


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.stack = LocalStack(workdir)
        self.servers: list[tuple[str, Path]] = []

    def start(self, servers: int) -> None:
        if self.args.forked:  # as `draftgen run` has it: ready before its workers start
            zygote()
        self.bootstrap = self.stack.start_kafka()
        tokenizer = build_qwen36_tokenizer(self.workdir / "tok")
        a = self.args
        for index in range(servers):
            log = self.workdir / f"requests-{index}.jsonl"
            url = self.stack.start_emulator(
                tokenizer,
                "--tokens-per-s",
                str(a.tokens_per_s),
                "--min-output-tokens",
                str(a.output_tokens),
                "--max-output-tokens",
                str(a.output_tokens),
                "--request-log",
                str(log),
                name=f"emu{index}",
            )
            self.servers.append((url, log))
        self.stack.forked = self.args.forked  # the workers only: the servers are the same

    def run(self, count: int, repeat: int) -> RunResult:
        prefix = f"f{count}r{repeat}{uuid.uuid4().hex[:6]}-"
        kafka = KafkaSettings(
            bootstrap=self.bootstrap, topic_prefix=prefix, partitions=self.args.partitions
        )
        asyncio.run(ensure_topics(kafka))
        records, digests = _prompts(self.args.per_server * count, prefix)
        asyncio.run(_publish(kafka, records))
        servers = self.servers[:count]
        t0 = time.time()
        workers: list[tuple[ManagedProcess, WorkerTimes]] = []
        a = self.args
        for index, (url, _) in enumerate(servers):
            spawned = time.time() - t0
            argv = generate_argv(url, kafka, a.concurrency, *a.worker_flags)
            process = self.stack.start_worker(f"{prefix}w{index}", argv)
            workers.append((process, WorkerTimes(spawned=spawned)))
        deadline = time.monotonic() + self.args.timeout
        requested: list[float | None] = [None] * count
        while time.monotonic() < deadline:
            for index, (_, log) in enumerate(servers):
                if requested[index] is None:
                    requested[index] = first_prompt_request(log, digests)
            for process, _ in workers:
                if not process.alive():
                    raise RuntimeError(f"a worker exited; see {process.log_path}")
            everyone = all(r is not None for r in requested)
            if everyone and asyncio.run(stable_members(kafka, GENERATE_GROUP)) == count:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"{count} workers not in and requesting in {self.args.timeout} s")
        time.sleep(self.args.settle)  # a rebalance still to come would show in the logs
        until = time.time()
        for (process, times), at in zip(workers, requested, strict=True):
            times.cpu_s = cpu_s(process.pid) if process.pid else 0.0
            read_worker_log(process.log_path, t0, until, times)
            times.requested = at - t0 if at is not None else None
        for process, _ in workers:
            process.stop()
        per_worker = [times for _, times in workers]
        generations = {g for w in per_worker for g in w.generations}
        all_assigned = max(w.assigned or float("inf") for w in per_worker)
        last_joined = max(w.joined or float("inf") for w in per_worker)
        return RunResult(
            workers=count,
            repeat=repeat,
            all_assigned=all_assigned,
            all_requesting=max(w.requested or float("inf") for w in per_worker),
            last_started=max(w.started or float("inf") for w in per_worker),
            group_part=all_assigned - last_joined,
            rebalances=len(generations),
            per_worker=per_worker,
        )


def import_cpu_s(repeats: int = 3) -> float:
    """CPU seconds one interpreter takes to import a generate worker's modules, alone (median):
    the machine's condition (a loaded one charges more CPU for the same work) and whether the
    dependencies' bytecode is compiled (PYTHONPYCACHEPREFIX pointing at an empty directory,
    with PYTHONDONTWRITEBYTECODE, reproduces an install that compiled none)."""
    code = "import streams.cli.main, streams.generate.app"
    times = []
    for _ in range(repeats):
        before = os.times()
        subprocess.run([sys.executable, "-c", code], check=True)
        after = os.times()
        times.append(
            after.children_user
            - before.children_user
            + after.children_system
            - before.children_system
        )
    return statistics.median(times)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({', '.join(f'{v:.1f}' for v in values)})"


def report(results: list[RunResult]) -> None:
    print()
    print(
        "| workers | all assigned s | all requesting s | last worker started s "
        "| group: last JoinGroup -> all assigned s | generations | worker CPU s (mean) |"
    )
    print("|---|---|---|---|---|---|---|")
    for count in sorted({r.workers for r in results}):
        runs = [r for r in results if r.workers == count]
        cpu = [statistics.mean(w.cpu_s for w in r.per_worker) for r in runs]
        print(
            f"| {count} | {_fmt([r.all_assigned for r in runs])} "
            f"| {_fmt([r.all_requesting for r in runs])} "
            f"| {_fmt([r.last_started for r in runs])} "
            f"| {_fmt([r.group_part for r in runs])} "
            f"| {', '.join(str(r.rebalances) for r in runs)} "
            f"| {_fmt(cpu)} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", default="1,4,8", help="fleet sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--per-server", type=int, default=100, help="prompts per server")
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--tokens-per-s", type=float, default=64.0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--settle", type=float, default=3.0, help="s watched after all are in")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--forked",
        action="store_true",
        help="fork the workers from a zygote that imported their modules (as `draftgen run` "
        "starts its workers) instead of exec'ing each",
    )
    parser.add_argument("worker_flags", nargs="*", help="extra flags for every worker (after --)")
    args = parser.parse_args()
    sizes = [int(n) for n in args.workers.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    bench = Bench(args, workdir)
    results = []
    imports = import_cpu_s()
    print(f"importing a generate worker's modules: {imports:.2f} CPU s (median of 3)", flush=True)
    with bench.stack:
        bench.start(max(sizes))
        for repeat in range(args.repeats):
            for count in sizes:
                result = bench.run(count, repeat)
                results.append(result)
                print(
                    f"N={count} #{repeat + 1}: all assigned {result.all_assigned:.1f} s, "
                    f"all requesting {result.all_requesting:.1f} s, last started "
                    f"{result.last_started:.1f} s, group part {result.group_part:.1f} s, "
                    f"{result.rebalances} generation(s)",
                    flush=True,
                )
                for index, w in enumerate(result.per_worker):
                    print(
                        f"  w{index}: spawned {w.spawned:.2f} "
                        f"started {_s(w.started)} joined {_s(w.joined)} assigned {_s(w.assigned)} "
                        f"requested {_s(w.requested)} cpu {w.cpu_s:.1f} s gens {w.generations}",
                        flush=True,
                    )
    report(results)
    if args.json:
        runs = [asdict(r) for r in results]
        args.json.write_text(json.dumps({"import_cpu_s": imports, "runs": runs}, indent=1))
    print(f"logs: {workdir / 'logs'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
