"""Nothing lost, nothing duplicated: kills, outages and failing servers on the real stack.

Each test ends with the same check: every published prompt is exactly once a committed sample
or a dead letter, and no prompt id appears twice among committed shards.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from compose.process import ManagedProcess
from streams.core.faults import AFTER_MARKER
from streams.core.normalize import make_prompt_record
from streams.core.settings import GENERATE_GROUP, PROMPTS, KafkaSettings
from tests.faults import KILLED, Crash
from tests.integration.probes import (
    Metrics,
    committed_offsets,
    emulator_stats,
    log_lines,
    log_size,
    metric_sum,
    metrics_url,
    scrape,
    topic_size,
)
from tests.polling import wait_for

pytestmark = pytest.mark.integration


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


LENGTHS = ("--min-output-tokens", "16", "--mean-output-tokens", "60", "--max-output-tokens", "3000")


def answer_lengths(pipeline: Any, rows: list[dict[str, Any]]) -> list[int]:
    """Output tokens of each row's answer. Outputs are deterministic per prompt, so an instant
    twin of the emulator tells each one's length."""
    twin, _ = pipeline.emulator("--tokens-per-s", "0", *LENGTHS, name="length-probe")
    client = openai.OpenAI(base_url=f"{twin}/v1", api_key="none")

    def length(row: dict[str, Any]) -> int:
        response = client.chat.completions.create(
            model="m",
            messages=row["messages"],
            tools=row.get("tools") or openai.NOT_GIVEN,
            max_tokens=8192,
            extra_body={"chat_template_kwargs": {"enable_thinking": True}},
        )
        return response.usage.completion_tokens if response.usage else 0

    return [length(row) for row in rows]


def partition_of(row: dict[str, Any], partitions: int) -> int:
    """The partition `publish` sends the row to (the producer's default: murmur2 of the key)."""
    key = make_prompt_record(row, "x").prompt_id.encode()
    every = list(range(partitions))
    return int(DefaultPartitioner()(key, every, every))


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def adopted_partitions(tokenize: ManagedProcess) -> set[int]:
    """Partitions the tokenize worker has adopted: their markers read, their records taken into
    windows (the shard sink logs `partition N: adopted at offset M ...` for each)."""
    pattern = r"partition (\d+): adopted at offset"
    found = (re.search(pattern, line) for line in log_lines(tokenize, pattern))
    return {int(match[1]) for match in found if match}


def test_kill_generate_worker_with_requests_in_flight(pipeline, write_prompts, tmp_path) -> None:
    """kill -9 with 16 requests in flight, a slow one at the head of partition 0 and fast ones
    after it (the faust #606 hazard): the committed offset never passes an unanswered prompt,
    and after a restart every prompt completes. Partition 1 stays empty until the fast prompts
    are done; then one prompt goes there, and its committed offset shows that the worker has
    committed since (a commit covers every partition's acked offsets)."""
    pipeline.partitions = 2
    rows = [orjson.loads(line) for line in write_prompts(200).read_bytes().splitlines()]
    on_0 = [row for row in rows if partition_of(row, 2) == 0][:80]
    on_1 = [row for row in rows if partition_of(row, 2) == 1][:8]
    lengths = answer_lengths(pipeline, on_0 + on_1)
    order = sorted(range(len(on_0)), key=lambda i: lengths[i], reverse=True)
    probe = on_1[min(range(len(on_1)), key=lambda i: lengths[len(on_0) + i])]

    # the head's answer scripted long (~860 tokens, ~29 s at 30 tokens/s), not merely the
    # longest drawn (~9 s): 20 completions and a commit behind it come first even when loaded
    head = on_0[order[0]]["messages"][-1]["content"]
    others = [row for i, row in enumerate(on_0) if i != order[0]] + on_1
    assert not any(head in str(m.get("content")) for row in others for m in row["messages"])
    slow = "<think>\n" + "The slow head keeps on thinking. " * 50 + "\n</think>\n\nDone."
    script = write_rows(tmp_path / "slow-head.jsonl", [{"match": head, "output": slow}])
    served = ("--tokens-per-s", "30", *LENGTHS, "--script", str(script))
    url, server = pipeline.emulator(*served)
    worker = pipeline.generate(url, "--concurrency", "16")
    tokenizer = pipeline.tokenize()
    summary = pipeline.publish(
        write_rows(tmp_path / "slowest-first.jsonl", [on_0[i] for i in order])
    )
    wait_for(lambda: topic_size(pipeline.kafka) >= 20, 120, "20 completions")
    probed = pipeline.publish(write_rows(tmp_path / "probe.jsonl", [probe]))
    wait_for(
        lambda: committed_offsets(pipeline.kafka, GENERATE_GROUP).get(1, 0) >= 1,
        60,
        "a commit after the 20 completions (the partition-1 prompt published then, committed)",
        interval=0.5,
    )
    worker.kill()
    committed = committed_offsets(pipeline.kafka, GENERATE_GROUP).get(0, 0)
    by_offset = asyncio.run(_prompt_ids_by_offset(pipeline.kafka))
    assert len(by_offset) == len(on_0), "the slowest-first prompts are all on partition 0"
    completed = set(pipeline.completions())
    assert by_offset[0] not in completed, "the slow head was still in flight at the kill"
    assert len(completed) >= 20, "fast prompts behind it had finished"
    missing = [o for o in range(committed) if by_offset[o] not in completed]
    assert not missing, f"committed offset {committed} passed unanswered prompts {missing}"

    # what follows is the restart, not the slow head: the same server at full speed, on its
    # port (the same --server: the same static member, the same settings)
    server.kill()
    port = url.rpartition(":")[2]
    fast = ("emulate-server", "--tokenizer-dir", str(pipeline.tokenizer_dir), "--port", port)
    pipeline.stack.start_worker("emulator-fast", [*fast, *served, "--tokens-per-s", "4000"])
    wait_for(lambda: emulator_stats(url), 120, "the server back at full speed", ignore=(OSError,))
    expected = set(summary.prompt_ids) | set(probed.prompt_ids)
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
    wait_for(lambda: topic_size(pipeline.kafka) >= 90, 120, "all completions")

    # 1. dies right after its 3rd commit marker, before the offsets are committed
    crashing = pipeline.tokenize("--shard-records", "10", crash=Crash(AFTER_MARKER, 3))
    wait_for(lambda: not crashing.alive(), 120, "the armed crash")
    assert crashing.popen is not None and crashing.popen.returncode == KILLED
    assert len(pipeline.store().markers()) >= 3

    # 2. killed while shards are open (records buffered, nothing flushed for a while)
    open_windows = pipeline.tokenize(
        "--shard-records", "1000", "--idle-flush", "60", "--metrics-port", "0"
    )
    metrics = wait_for(lambda: metrics_url(open_windows), 60, "the tokenize worker's metrics URL")
    wait_for(
        lambda: metric_sum(scrape(metrics), "draftgen_tokenize_open_bytes") > 0,
        60,
        "records held in open windows",
    )
    open_windows.kill()

    final = pipeline.tokenize("--shard-records", "10")
    pipeline.wait(expected, [generate, final])
    pipeline.assert_exactly_once(expected)


def test_kafka_broker_outage(pipeline, infra, write_prompts) -> None:
    url, _ = pipeline.emulator("--tokens-per-s", "100")
    # a heartbeat a second: the workers notice the broker gone within seconds
    observe = ("--metrics-port", "0", "--heartbeat-interval", "1")
    generate = pipeline.generate(url, "--concurrency", "8", *observe)
    workers = [generate, pipeline.tokenize(*observe)]
    first = pipeline.publish(write_prompts(16))
    # both stages running (the generate worker starts faster than the tokenize one)
    wait_for(lambda: pipeline.store().markers(), 120, "the tokenize worker's first shard")
    # published once both run, so the broker stops mid-generation however long the tokenize
    # worker took to start (80 at once could all be generated by then: nothing left in flight)
    more = pipeline.publish(write_prompts(80, name="more.jsonl", start=16))
    expected = set(first.prompt_ids) | set(more.prompt_ids)
    wait_for(lambda: topic_size(pipeline.kafka) >= 16 + 4, 120, "some of the next completions")
    metrics = wait_for(lambda: metrics_url(generate), 60, "the generate worker's metrics URL")

    def holding_undelivered() -> bool:
        # prompts in flight at the worker, none at the server: generated, waiting for Kafka
        in_flight = scrape(metrics)[("draftgen_generate_in_flight", frozenset({("server", url)}))]
        return in_flight > 0 and emulator_stats(url)["running"] == 0

    logs = [log_size(worker) for worker in workers]
    infra.kafka.stop()
    try:
        for worker, since in zip(workers, logs, strict=True):
            wait_for(
                lambda: log_lines(worker, "broker unreachable since", since),  # noqa: B023
                60,
                f"{worker.name} to report the broker unreachable",
            )
        wait_for(holding_undelivered, 60, "the generate worker holding completions unsent")
    finally:
        infra.kafka.restart()  # the session's broker: later tests need it whatever happened

    pipeline.wait(expected, workers, timeout=300)
    pipeline.assert_exactly_once(expected)
    assert all(worker.alive() for worker in workers), "stages wait out an outage, not exit"
    for worker, since in zip(workers, logs, strict=True):
        assert log_lines(worker, "broker reconnected after", since), worker.name


STORAGE_CALL = "(writing a shard|checking the seal)"


def test_s3_outage(pipeline, s3, write_prompts) -> None:
    url, _ = pipeline.emulator("--tokens-per-s", "100")
    tokenize = pipeline.tokenize()
    workers = [pipeline.generate(url, "--concurrency", "8"), tokenize]
    summary = pipeline.publish(write_prompts(40))
    wait_for(lambda: len(pipeline.store().markers()) >= 2, 120, "some shards")
    # every partition adopted (its markers read), so what fails below is the shard write
    wait_for(
        lambda: adopted_partitions(tokenize) == set(range(pipeline.partitions)),
        60,
        "the tokenize worker to take records of every partition",
    )

    since = log_size(tokenize)
    s3.stop()
    try:
        # published during the outage: shards that can only be written once S3 is back
        more = pipeline.publish(write_prompts(40, name="more.jsonl", start=40))
        # the window's first storage call fails: the seal check before it is built (sinks/
        # sink.py), or its shard write when that check got through just before the outage
        wait_for(
            lambda: log_lines(tokenize, STORAGE_CALL + " fail", since),
            120,
            "the tokenize worker to fail a storage call",
        )
    finally:
        s3.restart()

    expected = set(summary.prompt_ids) | set(more.prompt_ids)
    pipeline.wait(expected, workers, timeout=300)
    pipeline.assert_exactly_once(expected)
    assert all(worker.alive() for worker in workers)
    # the window was held and its storage calls retried until S3 was back (`until_done`'s report)
    assert log_lines(tokenize, STORAGE_CALL + " succeeded after", since)


def test_server_down_pauses_its_worker_without_dead_letters(pipeline, write_prompts) -> None:
    # ~1.4 s a request, 8 in flight: 60 prompts take ~10 s, so the kill lands mid-run
    url, server = pipeline.emulator("--tokens-per-s", "100")
    worker = pipeline.generate(
        url, "--concurrency", "8", "--max-attempts", "2", "--metrics-port", "0"
    )
    workers: list[ManagedProcess] = [worker, pipeline.tokenize()]
    metrics = wait_for(lambda: metrics_url(worker), 60, "the worker's metrics URL")
    summary = pipeline.publish(write_prompts(60))
    expected = set(summary.prompt_ids)
    wait_for(lambda: topic_size(pipeline.kafka) >= 5, 120, "some completions")

    server.kill()

    def paused_with_its_requests_given_back() -> Metrics | None:
        found = scrape(metrics)
        label = frozenset({("server", url)})
        in_flight = found[("draftgen_generate_in_flight", label)]
        paused = found[("draftgen_generate_paused", label)] == 1
        failed = metric_sum(found, "draftgen_generate_errors_total")
        return found if paused and failed > 0 and in_flight == 0 else None

    found = wait_for(
        paused_with_its_requests_given_back,
        60,
        "the worker paused, its requests ended and their slots and claims given back",
    )
    dead = found[("draftgen_generate_dead_letters_total", frozenset({("server", url)}))]
    assert dead == 0, "a server down spends no prompt"
    assert topic_size(pipeline.kafka) < 60
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
