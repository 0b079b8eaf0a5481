"""Nothing lost, nothing duplicated: kills, outages and failing servers on the real stack.

Each test ends with the same check: every published prompt is exactly once a committed sample
or a dead letter, and no prompt id appears twice among committed shards.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from compose.process import ManagedProcess
from streams.core.settings import COMPLETIONS, GENERATE_GROUP, PROMPTS, KafkaSettings

pytestmark = pytest.mark.integration


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


async def _end_offsets(kafka: KafkaSettings, topic: str) -> int:
    consumer = AIOKafkaConsumer(**kafka.aiokafka_kwargs())
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        name = kafka.topic(topic)
        partitions = [TopicPartition(name, p) for p in consumer.partitions_for_topic(name) or ()]
        return sum((await consumer.end_offsets(partitions)).values()) if partitions else 0
    finally:
        await consumer.stop()


def written(kafka: KafkaSettings, topic: str = COMPLETIONS) -> int:
    return asyncio.run(_end_offsets(kafka, topic))


async def _committed(kafka: KafkaSettings, group: str) -> dict[int, int]:
    admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(kafka.group(group))
        return {tp.partition: meta.offset for tp, meta in offsets.items()}
    finally:
        await admin.close()


async def _prompt_ids_by_offset(kafka: KafkaSettings) -> list[str]:
    """Partition 0 of the prompts topic, in offset order."""
    consumer = AIOKafkaConsumer(**kafka.aiokafka_kwargs(), enable_auto_commit=False)
    await consumer.start()
    tp = TopicPartition(kafka.topic(PROMPTS), 0)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    end = (await consumer.end_offsets([tp]))[tp]
    ids: list[str] = []
    try:
        while len(ids) < end:
            batch = await consumer.getmany(tp, timeout_ms=1000)
            ids += [record.key.decode() for record in batch.get(tp, [])]
    finally:
        await consumer.stop()
    return ids


def emulator_stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/stats", timeout=5) as response:
        return dict(json.loads(response.read()))


LENGTHS = ("--min-output-tokens", "16", "--mean-output-tokens", "60", "--max-output-tokens", "3000")


def slowest_first(pipeline: Any, source: Path) -> Path:
    """Reorder prompts so the longest answer is at the head of the partition. Outputs are
    deterministic per prompt, so an instant twin of the emulator tells each one's length."""
    twin, _ = pipeline.emulator("--tokens-per-s", "0", *LENGTHS, name="length-probe")
    client = openai.OpenAI(base_url=f"{twin}/v1", api_key="none")
    rows = [orjson.loads(line) for line in source.read_bytes().splitlines()]

    def length(row: dict[str, Any]) -> int:
        response = client.chat.completions.create(
            model="m",
            messages=row["messages"],
            tools=row.get("tools") or openai.NOT_GIVEN,
            max_tokens=8192,
            extra_body={"chat_template_kwargs": {"enable_thinking": True}},
        )
        return response.usage.completion_tokens if response.usage else 0

    rows.sort(key=length, reverse=True)
    out = source.with_name("slowest-first.jsonl")
    out.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return out


def test_kill_generate_worker_with_requests_in_flight(pipeline, write_prompts) -> None:
    """kill -9 with 16 requests in flight, a slow one at the head of the only partition and
    fast ones after it (the faust #606 hazard): the committed offset never passes an
    unanswered prompt, and after a restart every prompt completes."""
    pipeline.partitions = 1
    source = slowest_first(pipeline, write_prompts(80))
    url, _ = pipeline.emulator("--tokens-per-s", "15", *LENGTHS)
    worker = pipeline.generate(url, "--concurrency", "16")
    tokenizer = pipeline.tokenize()
    summary = pipeline.publish(source)
    expected = set(summary.prompt_ids)

    wait_for(lambda: written(pipeline.kafka) >= 20, 120, "20 completions")
    time.sleep(2.5)  # past faust's commit interval: acked offsets have been committed
    worker.kill()
    committed = asyncio.run(_committed(pipeline.kafka, GENERATE_GROUP)).get(0, 0)
    by_offset = asyncio.run(_prompt_ids_by_offset(pipeline.kafka))
    completed = set(pipeline.completions())
    assert by_offset[0] not in completed, "the slow head was still in flight at the kill"
    assert len(completed) >= 20, "fast prompts behind it had finished"
    missing = [o for o in range(committed) if by_offset[o] not in completed]
    assert not missing, f"committed offset {committed} passed unanswered prompts {missing}"

    restarted = pipeline.stack.restart(worker)
    pipeline.wait(expected, [restarted, tokenizer])
    pipeline.assert_exactly_once(expected)


def test_kill_tokenize_worker_between_marker_and_commit_and_mid_shard(
    pipeline, write_prompts
) -> None:
    pipeline.partitions = 2
    url, _ = pipeline.emulator()
    generate = pipeline.generate(url)
    summary = pipeline.publish(write_prompts(90))
    expected = set(summary.prompt_ids)
    wait_for(lambda: written(pipeline.kafka) >= 90, 120, "all completions")

    # 1. dies right after its 3rd commit marker, before the offsets are committed
    crashing = pipeline.tokenize("--shard-records", "10", env={"DRAFTGEN_FAULT_AFTER_MARKER": "3"})
    wait_for(lambda: not crashing.alive(), 120, "the armed crash")
    assert crashing.popen is not None and crashing.popen.returncode == 137
    assert len(pipeline.store().markers()) >= 3

    # 2. killed while shards are open (records buffered, nothing flushed for a while)
    open_windows = pipeline.tokenize("--shard-records", "1000", "--idle-flush", "60")
    time.sleep(8)
    open_windows.kill()

    final = pipeline.tokenize("--shard-records", "10")
    pipeline.wait(expected, [generate, final])
    pipeline.assert_exactly_once(expected)


def test_kafka_broker_outage(pipeline, infra, write_prompts) -> None:
    url, _ = pipeline.emulator("--tokens-per-s", "400")
    workers = [pipeline.generate(url, "--concurrency", "8"), pipeline.tokenize()]
    summary = pipeline.publish(write_prompts(80))
    expected = set(summary.prompt_ids)
    wait_for(lambda: written(pipeline.kafka) >= 10, 120, "some completions")

    infra.kafka.stop()
    time.sleep(20)
    infra.kafka.restart()

    pipeline.wait(expected, workers, timeout=300)
    pipeline.assert_exactly_once(expected)
    assert all(worker.alive() for worker in workers), "stages wait out an outage, not exit"


def test_s3_outage(pipeline, s3, write_prompts) -> None:
    url, _ = pipeline.emulator("--tokens-per-s", "400")
    workers = [pipeline.generate(url, "--concurrency", "8"), pipeline.tokenize()]
    summary = pipeline.publish(write_prompts(80))
    expected = set(summary.prompt_ids)
    wait_for(lambda: len(pipeline.store().markers()) >= 2, 120, "some shards")

    s3.stop()
    time.sleep(20)
    s3.restart()

    pipeline.wait(expected, workers, timeout=300)
    pipeline.assert_exactly_once(expected)
    assert all(worker.alive() for worker in workers)


def test_server_down_pauses_its_worker_without_dead_letters(pipeline, write_prompts) -> None:
    url, server = pipeline.emulator("--tokens-per-s", "300")
    worker = pipeline.generate(url, "--concurrency", "8", "--max-attempts", "2")
    workers: list[ManagedProcess] = [worker, pipeline.tokenize()]
    summary = pipeline.publish(write_prompts(60))
    expected = set(summary.prompt_ids)
    wait_for(lambda: written(pipeline.kafka) >= 5, 120, "some completions")

    server.kill()
    time.sleep(10)  # far more failed attempts than --max-attempts, were they counted
    assert written(pipeline.kafka) < 60
    pipeline.stack.restart(server)

    result = pipeline.wait(expected, workers)
    assert not result.dead_letters.prompt_ids, result.dead_letters.by_reason
    pipeline.assert_exactly_once(expected)
    log = worker.log_path.read_text()
    assert "is down; pausing" in log and "healthy again; resuming" in log


def test_transient_errors_are_retried_and_permanent_ones_dead_lettered(
    pipeline, write_prompts
) -> None:
    url, _ = pipeline.emulator(
        "--fail-503-rate",
        "0.2",
        "--fail-500-rate",
        "0.1",
        "--drop-rate",
        "0.05",
        "--timeout-rate",
        "0.03",
        "--timeout-hang-s",
        "2",
        "--fail-400-rate",
        "0.1",
    )
    workers = [
        pipeline.generate(url, "--max-attempts", "12", "--request-timeout", "5"),
        pipeline.tokenize(),
    ]
    summary = pipeline.publish(write_prompts(80))
    expected = set(summary.prompt_ids)
    pipeline.wait(expected, workers)
    pipeline.assert_exactly_once(expected)

    letters = pipeline.dead_letters()
    assert letters, "some prompts should have hit the injected 400"
    assert {(letter.stage, letter.kind) for letter in letters} == {("generate", "context_too_long")}
    errors = emulator_stats(url)["errors"]
    assert sum(errors.values()) > len(letters), "transient failures happened and were retried"
    assert len(pipeline.completions()) == len(expected) - len(letters)
