"""Generation throughput with 1, 2 and 4 emulated servers, and the tail with one slow server
among four, without and with work stealing, measured side by side in one run.

    .venv/bin/python tests/benchmarks/bench_scaling.py [--prompts N] [--tokens-per-s T]

Starts its own Kafka broker (no S3, no tokenize stage: this measures the generate stage).
A run ends when the generate group has committed every prompt. The tail is the time from the
moment the last fast server went idle for good to the end of the run: how long fast servers
sit idle while the slow one works through the backlog of its partitions.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from compose.stack import LocalStack
from compose.tiny_tokenizers import build_qwen36_tokenizer
from producers.publish import publish
from producers.sources import parse_source_spec
from streams.core.settings import GENERATE_GROUP, PROMPTS, KafkaSettings
from tests.integration.probes import emulator_stats, stable_members

PARTITIONS = 16


@dataclass
class Result:
    label: str
    seconds: float
    prompts: int
    tail_s: float
    requests: int

    @property
    def per_s(self) -> float:
        return self.prompts / self.seconds


async def _lag(kafka: KafkaSettings, admin: AIOKafkaAdminClient, consumer: AIOKafkaConsumer) -> int:
    topic = kafka.topic(PROMPTS)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    committed = await admin.list_consumer_group_offsets(kafka.group(GENERATE_GROUP))
    ends = await consumer.end_offsets(tps)
    return sum(end - (committed[tp].offset if tp in committed else 0) for tp, end in ends.items())


async def _watch(kafka: KafkaSettings, urls: list[str], fast: list[str]) -> tuple[float, float]:
    """Wait for the end; returns (run seconds, tail seconds), timed from now."""
    admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
    await admin.start()
    consumer = AIOKafkaConsumer(**kafka.aiokafka_kwargs(), enable_auto_commit=False)
    await consumer.start()
    started = time.monotonic()
    last_fast_busy = started
    try:
        while True:
            now = time.monotonic()
            running = [emulator_stats(u)["running"] for u in fast]
            if any(running):
                last_fast_busy = now
            if await _lag(kafka, admin, consumer) == 0:
                return now - started, now - last_fast_busy
            if now - started > 600:
                raise RuntimeError("run did not finish in 600 s")
            await asyncio.sleep(0.2)
    finally:
        await consumer.stop()
        await admin.close()


def _prompts(path: Path, count: int) -> Path:
    with path.open("wb") as handle:
        for index in range(count):
            text = f"[{index}] explain write-ahead logs, variant {uuid.uuid4().hex[:6]}"
            handle.write(orjson.dumps({"messages": [{"role": "user", "content": text}]}) + b"\n")
    return path


def scenario(
    stack: LocalStack,
    bootstrap: str,
    tokenizer: Path,
    label: str,
    speeds: list[float],
    prompts: int,
    steal: bool,
    concurrency: int,
) -> Result:
    prefix = f"b{uuid.uuid4().hex[:6]}-"
    kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=prefix, partitions=PARTITIONS)
    common = ["--bootstrap", bootstrap, "--topic-prefix", prefix, "--partitions", str(PARTITIONS)]
    urls, procs = [], []
    for index, speed in enumerate(speeds):
        url, emulator = stack.start_emulator_process(
            tokenizer, "--tokens-per-s", str(speed), "--seed", str(index), name=f"emu-{label}"
        )
        urls.append(url)
        procs.append(emulator)
    # stealing is on by default: the runs without it turn it off
    extra = [] if steal else ["--steal-after", "0"]
    for url in urls:
        argv = ["worker", "generate", "--server", url, "--concurrency", str(concurrency)]
        log = ["--log-level", "INFO"]  # the thieves log what they took
        procs.append(stack.start_worker(f"gen-{label}", [*log, *argv, *common, *extra]))
    deadline = time.monotonic() + 120
    # all joined: no rebalance mid-measure
    while asyncio.run(stable_members(kafka, GENERATE_GROUP)) < len(urls):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{label}: workers did not join")
        time.sleep(0.5)
    source = _prompts(stack.workdir / f"{prefix}prompts.jsonl", prompts)
    slowest = min(speeds)
    fast = [u for u, s in zip(urls, speeds, strict=True) if s > slowest] or urls
    asyncio.run(publish(kafka, [parse_source_spec(str(source))], progress=False))
    seconds, tail = asyncio.run(_watch(kafka, urls, fast))
    # each worker's first request is its probe for token ids (streams/generate/exact_ids.py)
    requests = sum(emulator_stats(u)["requests"] for u in urls) - len(urls)
    for process in reversed(procs):
        process.stop()
    return Result(label, seconds, prompts, tail, requests)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--tokens-per-s", type=float, default=100.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--only-tail", action="store_true", help="skip the 1/2/4 server runs")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    stack = LocalStack(workdir)
    speed = args.tokens_per_s
    try:
        bootstrap = stack.start_kafka()
        tokenizer = build_qwen36_tokenizer(workdir / "tok")
        results: dict[str, Result] = {}
        runs = [
            ("1 server", [speed], False),
            ("2 servers", [speed] * 2, False),
            ("4 servers", [speed] * 4, False),
            ("4, one 2x slower", [speed] * 3 + [speed / 2], False),
            ("4, one 2x slower, stealing", [speed] * 3 + [speed / 2], True),
        ]
        if args.only_tail:
            runs = runs[3:]
        for label, speeds, steal in runs:
            count = args.prompts * (2 if len(speeds) == 4 else 1)
            result = scenario(
                stack,
                bootstrap,
                tokenizer,
                label,
                speeds,
                count,
                steal,
                args.concurrency,
            )
            results[label] = result
            print(
                f"{label:<28} {result.prompts:>5} prompts in {result.seconds:6.1f}s "
                f"= {result.per_s:6.1f}/s, tail {result.tail_s:5.1f}s, "
                f"requests {result.requests}",
                flush=True,
            )
        print()
        if "1 server" in results:
            one = results["1 server"].per_s
            for label in ("2 servers", "4 servers"):
                print(f"throughput {label} / 1 server: {results[label].per_s / one:.2f}x")
        before = results["4, one 2x slower"]
        after = results["4, one 2x slower, stealing"]
        print(
            f"slow-server tail: {before.tail_s:.1f}s -> {after.tail_s:.1f}s "
            f"(after/before {after.tail_s / max(before.tail_s, 1e-9):.2f})"
        )
        print(
            f"slow-server run time: {before.seconds:.1f}s -> {after.seconds:.1f}s "
            f"(after/before {after.seconds / before.seconds:.2f}); "
            f"requests {before.requests} -> {after.requests} "
            f"({after.requests - after.prompts} generated twice)"
        )
    finally:
        stack.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
