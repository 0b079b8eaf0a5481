"""One message size limit and one compression setting, applied to every client and topic."""

from __future__ import annotations

import asyncio
import gzip
import os

import pytest
from aiokafka import AIOKafkaProducer

from streams.core.faust_app import create_app
from streams.core.settings import COMPLETIONS, KafkaSettings, record_size_bound
from streams.core.topics import topic_configs

KAFKA = KafkaSettings(bootstrap="127.0.0.1:9", max_message_bytes=4 * 1024 * 1024)


def test_what_a_producer_accepts_the_topic_stores_and_a_consumer_fetches() -> None:
    producer, consumer = KAFKA.producer_kwargs(), KAFKA.consumer_kwargs()
    topic = int(topic_configs(KAFKA)[COMPLETIONS]["max.message.bytes"])
    assert producer["max_request_size"] == KAFKA.max_message_bytes <= topic
    assert consumer["max_partition_fetch_bytes"] >= topic
    assert consumer["fetch_max_bytes"] >= topic
    # a message of the limit that gzip cannot shrink still fits the topic once compressed
    batch = gzip.compress(os.urandom(KAFKA.max_message_bytes))
    assert len(batch) + 61 <= topic  # 61: the record batch header


def test_the_faust_apps_use_the_same_limit_and_compression() -> None:
    conf = create_app("size-test", KAFKA, prefetch=4).conf
    assert conf.producer_max_request_size == KAFKA.max_message_bytes
    assert conf.producer_compression_type == "gzip"
    assert conf.consumer_max_fetch_size == KAFKA.topic_max_message_bytes


def test_compression_can_be_turned_off() -> None:
    kafka = KafkaSettings(bootstrap="127.0.0.1:9", compression="none")
    assert kafka.producer_kwargs()["compression_type"] is None


def test_too_large_counts_the_batch_and_record_headers() -> None:
    limit = KAFKA.max_message_bytes
    assert KAFKA.too_large(b"key", b"x" * (limit - 100)) is None
    # the value alone is under the limit; with the record and batch headers it is not
    problem = KAFKA.too_large(b"key", b"x" * (limit - 10))
    assert problem is not None and f"{limit}-byte limit" in problem


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (b"key", b""),
        (None, b"v"),
        (b"k" * 200, b"x" * 127),
        (b"prompt-id", b"x" * 128),
        (b"prompt-id", b"x" * 70_000),
        (b"prompt-id", b"x" * 3_000_000),
    ],
)
def test_the_size_bound_holds_for_what_the_producer_encodes(
    key: bytes | None, value: bytes
) -> None:
    """The bound from Kafka's documented batch format against a batch the producer built
    (uncompressed, so its size is the encoded one)."""

    async def encoded() -> int:
        producer = AIOKafkaProducer(
            bootstrap_servers="127.0.0.1:9", max_batch_size=2 * len(value) + 1024
        )
        try:
            batch = producer.create_batch()
            assert batch.append(key=key, value=value, timestamp=None) is not None
            return batch.size()
        finally:
            await producer.stop()

    size = asyncio.run(encoded())
    bound = record_size_bound(key, value)
    # an upper bound, and a close one: at most the varints' slack (time and offset deltas)
    assert size <= bound <= size + 21
