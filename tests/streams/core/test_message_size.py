"""One message size limit and one compression setting, applied to every client and topic."""

from __future__ import annotations

import gzip
import os

from streams.core.faust_app import create_app
from streams.core.settings import COMPLETIONS, KafkaSettings
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


def test_too_large_uses_the_producers_own_estimate() -> None:
    limit = KAFKA.max_message_bytes
    assert KAFKA.too_large(b"key", b"x" * (limit - 100)) is None
    # the value alone is under the limit; with the record and batch headers it is not
    problem = KAFKA.too_large(b"key", b"x" * (limit - 10))
    assert problem is not None and f"{limit}-byte limit" in problem
