"""How fast a generate worker reacts to a prompt: warm (joined and idle) and cold (process start).

    flock /tmp/draftgen-heavy.lock .venv/bin/python tests/benchmarks/bench_startup.py [--repeats N]

Starts its own Kafka broker and one emulated server that answers at once, so what is measured
is the worker and Kafka, not generation.

- warm: one worker (static membership) is started and left until it has joined the group and
  logged "generating with model"; then one prompt at a time is published and the time from the
  send to the emulator receiving its request is taken (the emulator stamps each request).
- cold: the prompt is published first, then a new worker process is started (a new group, so
  it joins from nothing); the time from spawning it to the prompt's request at the emulator.
  The worker's first request is its probe for token ids; the prompt's is the second.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaProducer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from compose.process import ManagedProcess
from compose.stack import LocalStack
from compose.tiny_tokenizers import build_qwen36_tokenizer
from streams.core.normalize import prompt_id
from streams.core.records import PromptRecord
from streams.core.settings import GENERATE_GROUP, PROMPTS, KafkaSettings
from streams.core.topics import ensure_topics
from tests.benchmarks.workers import generate_argv
from tests.integration.probes import emulator_stats, stable_members

PARTITIONS = 16
READY_LINE = "generating with model"


def _requests(url: str) -> int:
    return int(emulator_stats(url)["requests"])


def _request_seen(url: str, count: int, timeout: float = 60.0) -> float:
    """Wait until the emulator has had `count` requests; the wall time of the latest one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = emulator_stats(url)
        if int(stats["requests"]) >= count:
            return float(stats["last_request_at"])
        time.sleep(0.01)
    raise RuntimeError(f"no request #{count} at {url} within {timeout} s")


def _wait_idle(worker: ManagedProcess, kafka: KafkaSettings, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not worker.alive():
            raise RuntimeError(f"worker exited; see {worker.log_path}")
        joined = READY_LINE in worker.log_path.read_text(errors="replace")
        if joined and asyncio.run(stable_members(kafka, GENERATE_GROUP)) >= 1:
            return
        time.sleep(0.2)
    raise RuntimeError(f"worker not idle within {timeout} s; see {worker.log_path}")


def _record(label: str) -> tuple[bytes, bytes]:
    messages = [{"role": "user", "content": f"{label} {uuid.uuid4().hex}"}]
    pid = prompt_id(messages, None)
    return pid.encode(), PromptRecord(prompt_id=pid, messages=messages, source="bench").encode()


async def _publish(kafka: KafkaSettings, key: bytes, value: bytes) -> float:
    """Send one prompt with a producer already connected; the wall time of the send."""
    producer = AIOKafkaProducer(**kafka.aiokafka_kwargs(), acks="all")
    await producer.start()
    try:
        await producer.client.force_metadata_update()
        sent_at = time.time()
        await producer.send_and_wait(kafka.topic(PROMPTS), key=key, value=value)
        return sent_at
    finally:
        await producer.stop()


def _kafka(bootstrap: str, letter: str) -> KafkaSettings:
    prefix = f"{letter}{uuid.uuid4().hex[:6]}-"  # topics and group of their own
    return KafkaSettings(bootstrap=bootstrap, topic_prefix=prefix, partitions=PARTITIONS)


def warm(stack: LocalStack, bootstrap: str, url: str, repeats: int) -> list[float]:
    kafka = _kafka(bootstrap, "w")
    argv = generate_argv(url, kafka, 4, "--instance-id", "bench-warm")
    worker = stack.start_worker("gen-warm", argv)
    _wait_idle(worker, kafka)
    time.sleep(2.0)  # idle for a while: what is measured is the steady idle fetch
    times = []
    for index in range(repeats):
        before = _requests(url)
        sent_at = asyncio.run(_publish(kafka, *_record(f"warm {index}")))
        times.append(_request_seen(url, before + 1) - sent_at)
        print(f"warm #{index + 1}: {times[-1]:.3f} s", flush=True)
        time.sleep(2.0)
    worker.stop()
    return times


def cold(stack: LocalStack, bootstrap: str, url: str, repeats: int) -> list[float]:
    times = []
    for index in range(repeats):
        kafka = _kafka(bootstrap, "c")
        asyncio.run(ensure_topics(kafka))
        asyncio.run(_publish(kafka, *_record(f"cold {index}")))
        before = _requests(url)
        started_at = time.time()
        worker = stack.start_worker("gen-cold", generate_argv(url, kafka, 4))
        # its probe for token ids comes first, then the prompt
        times.append(_request_seen(url, before + 2) - started_at)
        print(f"cold #{index + 1}: {times[-1]:.3f} s", flush=True)
        worker.stop()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    with LocalStack(workdir) as stack:
        bootstrap = stack.start_kafka()
        tokenizer = build_qwen36_tokenizer(workdir / "tok")
        url = stack.start_emulator(tokenizer, name="emu")
        warm_s = warm(stack, bootstrap, url, args.repeats)
        cold_s = cold(stack, bootstrap, url, args.repeats)
        print()
        print(
            f"warm: publish -> first request, median {statistics.median(warm_s):.2f} s "
            f"({', '.join(f'{t:.2f}' for t in warm_s)})"
        )
        print(
            f"cold: process start -> first prompt request, median "
            f"{statistics.median(cold_s):.2f} s ({', '.join(f'{t:.2f}' for t in cold_s)})"
        )
        print(f"logs: {workdir / 'logs'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
