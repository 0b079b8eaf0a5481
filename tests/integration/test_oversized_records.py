"""One oversized or undecodable record affects only itself, on the real broker: 5 MB that is
not UTF-8 on `prompts` and on `completions`, records exactly at the topics' limit, one just
over it, and a huge valid prompt, among ordinary prompts before and after them on the same
partitions. Every dead letter is written (cut to the limit where it must be, with the
original's size and SHA-256), and every ordinary prompt ends as a sample."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import random

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import MessageSizeTooLargeError

from streams.core.settings import COMPLETIONS, DEAD_LETTERS, PROMPTS, KafkaSettings

pytestmark = pytest.mark.integration

# a v2 record batch header (Kafka's DefaultRecordBatch.RECORD_BATCH_OVERHEAD)
BATCH_HEADER = 61
FIVE_MB = b"\xff\xfe" * (5 * 1024 * 1024 // 2)  # not UTF-8


def varint_size(n: int) -> int:
    """Bytes of Kafka's zigzag varint of `n` (the record format's lengths and deltas)."""
    zigzag, size = (n << 1) ^ (n >> 63), 1
    while zigzag >= 0x80:
        zigzag >>= 7
        size += 1
    return size


def batch_size(key: bytes, value: bytes) -> int:
    """The exact size of a batch of this one record (magic v2, uncompressed, Kafka's documented
    record format): what the broker compares with the topic's max.message.bytes."""
    # attributes, timestamp delta 0, offset delta 0; key and value with their lengths; 0 headers
    body = 3 + sum(varint_size(len(part)) + len(part) for part in (key, value)) + varint_size(0)
    return BATCH_HEADER + varint_size(body) + body


def at_size(key: bytes, batch_bytes: int) -> bytes:
    """A value (not JSON) whose one-record batch is exactly `batch_bytes`."""
    size = batch_bytes - batch_size(key, b"")
    while batch_size(key, b"x" * size) > batch_bytes:
        size -= 1  # the length varints grew
    value = b"x" * size
    assert batch_size(key, value) == batch_bytes
    return value


async def _produce(kafka: KafkaSettings, topic: str, key: bytes, value: bytes) -> str | None:
    """Produce as an outside client would (uncompressed, no size check of ours); returns the
    broker's refusal, if any."""
    producer = AIOKafkaProducer(
        **kafka.aiokafka_kwargs(), max_request_size=64 * 1024 * 1024, acks="all"
    )
    await producer.start()
    try:
        await producer.send_and_wait(kafka.topic(topic), key=key, value=value)
    except MessageSizeTooLargeError as err:
        return repr(err)
    finally:
        await producer.stop()
    return None


def test_oversized_and_undecodable_records_cost_only_themselves(
    pipeline, write_prompts, tmp_path
) -> None:
    pipeline.partitions = 1  # every bad record is ahead of the later prompts
    kafka = pipeline.kafka
    limit = kafka.topic_max_message_bytes
    url, _ = pipeline.emulator()
    workers = [pipeline.generate(url), pipeline.tokenize()]

    before = pipeline.publish(write_prompts(60))
    huge_prompt = {"messages": [{"role": "user", "content": "why? " * (600 * 1024)}]}  # 3 MB
    huge = tmp_path / "huge.jsonl"
    huge.write_bytes(orjson.dumps(huge_prompt) + b"\n")
    [huge_id] = pipeline.publish(huge).prompt_ids
    bad = {
        (PROMPTS, b"prompt-5mb-not-utf8"): FIVE_MB,
        (COMPLETIONS, b"completion-5mb-not-utf8"): FIVE_MB,
        (PROMPTS, b"prompt-at-limit"): at_size(b"prompt-at-limit", limit),
        (COMPLETIONS, b"completion-at-limit"): at_size(b"completion-at-limit", limit),
    }
    for (topic, key), value in bad.items():
        assert asyncio.run(_produce(kafka, topic, key, value)) is None, key
    over = at_size(b"prompt-over-limit", limit + 1)
    refusal = asyncio.run(_produce(kafka, PROMPTS, b"prompt-over-limit", over))
    assert refusal is not None  # the broker refuses it at the door: it never reaches a stage
    after = pipeline.publish(write_prompts(60, name="later.jsonl", start=1000))

    ordinary = set(before.prompt_ids) | set(after.prompt_ids)
    bad_ids = {key.decode() for _, key in bad}
    expected = ordinary | bad_ids | {huge_id}
    result = pipeline.wait(expected, workers, timeout=240)
    pipeline.assert_exactly_once(expected)
    assert result.figures.samples == len(ordinary)

    letters = {letter.prompt_id: letter for letter in pipeline.dead_letters()}
    assert set(letters) == bad_ids | {huge_id}
    kinds = {pid: (letter.stage, letter.kind) for pid, letter in letters.items()}
    assert kinds == {
        "prompt-5mb-not-utf8": ("generate", "invalid_utf8"),
        "completion-5mb-not-utf8": ("tokenize", "invalid_utf8"),
        "prompt-at-limit": ("generate", "not_json"),
        "completion-at-limit": ("tokenize", "not_json"),
        huge_id: ("generate", kinds[huge_id][1]),
    }
    for (_, key), value in bad.items():
        letter = letters[key.decode()]
        assert letter.payload_size == len(value)
        assert letter.payload_sha256 == hashlib.sha256(value).hexdigest()
        kept = letter.payload_bytes()
        assert value.startswith(kept) and letter.payload_truncated == (kept != value)
        assert kafka.too_large(key, letter.encode()) is None
    # 5 MB as base64 fits whole; a record at the limit cannot, so its letter is cut
    assert not letters["prompt-5mb-not-utf8"].payload_truncated
    assert letters["prompt-at-limit"].payload_truncated
    assert (letters["completion-at-limit"].origin or "").startswith(
        f"{kafka.topic(COMPLETIONS)}-0@"
    )
    assert all(worker.alive() for worker in workers)
    for worker in workers:
        log = worker.log_path.read_text()
        # no write retried as if Kafka were down, no letter sent bare or dropped
        assert " since " not in log and "without its payload" not in log and "dropped" not in log


async def _create_small_topics(kafka: KafkaSettings, limit: int) -> None:
    """`prompts` and `dead-letters` created by someone else, with a lower limit than ours."""
    admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
    await admin.start()
    try:
        config = {"max.message.bytes": str(limit)}
        await admin.create_topics(
            [
                NewTopic(kafka.topic(name), 1, 1, topic_configs=config)
                for name in (PROMPTS, DEAD_LETTERS)
            ]
        )
    finally:
        await admin.close()


def test_publish_checks_prompts_against_a_topic_with_a_lower_limit(
    pipeline, write_prompts, tmp_path, caplog
) -> None:
    """A topic created elsewhere with a lower max.message.bytes than ours: publish refuses a
    prompt over it with one line, before the broker could (an idempotent producer cannot get
    past a refused batch), and its dead letter is cut to what the dead-letters topic takes."""
    kafka = pipeline.kafka
    asyncio.run(_create_small_topics(kafka, 64 * 1024))
    # 128 KB that gzip cannot shrink below the topic's 64 KiB (and far under our 8 MiB)
    noise = base64.b64encode(random.Random(1).randbytes(96 * 1024)).decode()
    big = {"messages": [{"role": "user", "content": noise}]}
    source = tmp_path / "mixed.jsonl"
    first, later = write_prompts(5), write_prompts(5, name="later.jsonl", start=100)
    source.write_bytes(first.read_bytes() + orjson.dumps(big) + b"\n" + later.read_bytes())

    with caplog.at_level(logging.WARNING, logger="producers.publish"):
        summary = pipeline.publish(source)
    assert summary.published == 10 and len(summary.prompt_ids) == 10
    assert summary.rejected == {"record_too_large": 1}
    [line] = [r.getMessage() for r in caplog.records if r.name == "producers.publish"]
    assert "mixed.jsonl row 5" in line and "-byte limit" in line
    [letter] = pipeline.dead_letters()
    assert (letter.stage, letter.kind, letter.origin) == (
        "publish",
        "record_too_large",
        f"{source}:5",
    )
    assert letter.payload_truncated and letter.payload_size is not None
    assert letter.payload_size > 128 * 1024 > len(letter.encode())
