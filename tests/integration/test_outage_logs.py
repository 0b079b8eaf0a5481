"""An outage reads as a few lines per worker, not a flood: the broker stopped for 20 s."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.core.settings import COMPLETIONS, KafkaSettings
from tests.polling import wait_for

pytestmark = pytest.mark.integration

OUTAGE_S = 20.0
# lines a worker may write from the broker stop until it has reconnected: ours ("unreachable
# since", "reconnected after"), the clients' first errors and their rate-limited repeats
MAX_LINES = int(os.environ.get("DRAFTGEN_TEST_MAX_OUTAGE_LINES", "60"))


async def _written(kafka: KafkaSettings) -> int:
    consumer = AIOKafkaConsumer(**kafka.aiokafka_kwargs())
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        name = kafka.topic(COMPLETIONS)
        partitions = [TopicPartition(name, p) for p in consumer.partitions_for_topic(name) or ()]
        return sum((await consumer.end_offsets(partitions)).values()) if partitions else 0
    finally:
        await consumer.stop()


def lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines()


def test_a_broker_stop_is_a_few_log_lines_per_worker(pipeline, infra, write_prompts) -> None:
    url, _ = pipeline.emulator("--tokens-per-s", "200")
    workers = [pipeline.generate(url, "--concurrency", "8"), pipeline.tokenize()]
    summary = pipeline.publish(write_prompts(120))
    expected = set(summary.prompt_ids)
    wait_for(lambda: asyncio.run(_written(pipeline.kafka)) >= 10, 120, "some completions")
    # both stages running (the generate worker starts faster than the tokenize one)
    wait_for(lambda: pipeline.store().markers(), 120, "the tokenize worker's first shard")

    before = {w.name: len(lines(w.log_path)) for w in workers}
    infra.kafka.stop()
    stopped = time.monotonic()
    try:
        # the broker stays down OUTAGE_S; meanwhile each worker says so (once)
        wait_for(
            lambda: (
                time.monotonic() - stopped >= OUTAGE_S
                and all("broker unreachable since" in w.log_path.read_text() for w in workers)
            ),
            OUTAGE_S + 60,
            "every worker to report the broker unreachable",
        )
    finally:
        infra.kafka.restart()  # the next tests of this xdist worker share the broker
    wait_for(
        lambda: all("broker reconnected after" in w.log_path.read_text() for w in workers),
        120,
        "every worker to report the reconnection",
    )
    written = {}
    for worker in workers:
        during = lines(worker.log_path)[before[worker.name] :]
        reconnected = next(i for i, line in enumerate(during) if "reconnected after" in line)
        written[worker.name] = reconnected + 1
        print(f"{worker.name}: {written[worker.name]} lines during the outage")
        print("\n".join(during[: reconnected + 1][-80:]))
    assert all(n <= MAX_LINES for n in written.values()), written

    pipeline.wait(expected, workers, timeout=300)
    pipeline.assert_exactly_once(expected)
    assert all(worker.alive() for worker in workers)
