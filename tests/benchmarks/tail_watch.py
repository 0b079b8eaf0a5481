"""What the tail benchmark watches during a run: the emulated servers' counters, the workers'
CPU and memory, and the end of the run on the completions topic."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any


def server_stats(urls: list[str]) -> list[dict[str, Any]]:
    from tests.integration.probes import emulator_stats

    return [emulator_stats(u) for u in urls]


def wait_idle(urls: list[str]) -> list[dict[str, Any]]:
    """The servers' counters once nothing runs or waits (a duplicate may still be running)."""
    deadline = time.monotonic() + 600
    while True:
        stats = server_stats(urls)
        if all(s["running"] == 0 and s["queued"] == 0 for s in stats):
            return stats
        if time.monotonic() > deadline:
            raise RuntimeError("servers still busy after 600 s")
        time.sleep(0.2)


def tokens_between(after: list[dict[str, Any]], before: list[dict[str, Any]]) -> int:
    return sum(
        a["completion_tokens"] - b["completion_tokens"] for a, b in zip(after, before, strict=True)
    )


class WorkerSampler(threading.Thread):
    """Samples the servers' running requests every `interval` s from its start to `stop()`:
    when every slot was first busy, when last, and the mean share of slots busy."""

    def __init__(self, urls: list[str], slots: int, interval: float = 0.05):
        super().__init__(daemon=True)
        self.urls = urls
        self.slots = slots * len(urls)
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                running = sum(s["running"] for s in server_stats(self.urls))
            except OSError:
                running = 0
            self.samples.append((time.time(), running))
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def figures(self, start: float, end: float) -> dict[str, float | None]:
        inside = [(t, n) for t, n in self.samples if start <= t <= end]
        full = [t for t, n in inside if n >= self.slots]
        return {
            "all_slots_busy_s": full[0] - start if full else None,
            "last_all_busy_s": full[-1] - start if full else None,
            "busy_share": sum(n for _, n in inside) / (len(inside) * self.slots) if inside else 0.0,
        }


async def watch_end(
    kafka: Any, count: int, workers: list[Any], timeout_s: float = 1800.0
) -> tuple[float, float]:
    """(time the last prompt's first completion landed, time every prompt was committed)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    from streams.core.settings import COMPLETIONS, GENERATE_GROUP, PROMPTS

    admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
    await admin.start()
    ends = AIOKafkaConsumer(**kafka.aiokafka_kwargs(), enable_auto_commit=False)
    await ends.start()
    reader = AIOKafkaConsumer(
        **kafka.aiokafka_kwargs(), **kafka.consumer_kwargs(), enable_auto_commit=False
    )
    await reader.start()
    prompts = [TopicPartition(kafka.topic(PROMPTS), p) for p in range(kafka.partitions)]
    completions = [TopicPartition(kafka.topic(COMPLETIONS), p) for p in range(kafka.partitions)]
    reader.assign(completions)
    await reader.seek_to_beginning(*completions)
    seen: set[bytes] = set()
    last_completion = 0.0

    async def read() -> None:
        nonlocal last_completion
        while len(seen) < count:
            batch = await reader.getmany(timeout_ms=100)
            for records in batch.values():
                for record in records:
                    if record.key not in seen:
                        seen.add(record.key)
                        last_completion = time.time()

    reading = asyncio.create_task(read())
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            committed = await admin.list_consumer_group_offsets(kafka.group(GENERATE_GROUP))
            end = await ends.end_offsets(prompts)
            lag = sum(o - (committed[tp].offset if tp in committed else 0) for tp, o in end.items())
            if lag == 0 and sum(end.values()) >= count:
                done = time.time()
                await asyncio.wait_for(reading, 60)
                return last_completion, done
            if time.monotonic() > deadline:
                raise RuntimeError(f"run did not finish in {timeout_s:.0f} s")
            for worker in workers:
                if not worker.alive():
                    raise RuntimeError(f"worker exited; see {worker.log_path}")
            await asyncio.sleep(0.1)
    finally:
        reading.cancel()
        await reader.stop()
        await ends.stop()
        await admin.close()
