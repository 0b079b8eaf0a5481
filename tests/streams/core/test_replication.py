"""Replication and producer durability, as settings: the defaults for a cluster of any size,
the topics' configurations, and every producer of pipeline records acks=all and idempotent
(faust's too). The cluster itself is tests/integration/test_cluster.py."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from streams.core.faust_app import create_app
from streams.core.settings import (
    COMPLETIONS,
    DEAD_LETTERS,
    GENERATED,
    PROMPTS,
    WORKER_STATS,
    KafkaSettings,
)
from streams.core.topics import topic_configs

KAFKA = KafkaSettings(bootstrap="127.0.0.1:9")  # never connected to


@pytest.mark.parametrize(
    ("brokers", "expected"), [(1, (1, 1)), (2, (2, 1)), (3, (3, 2)), (5, (3, 2)), (0, (1, 1))]
)
def test_default_replicas_follow_the_cluster(brokers: int, expected: tuple[int, int]) -> None:
    assert KAFKA.replicas_for(brokers) == expected


def test_replication_settings_override_the_defaults() -> None:
    kafka = KafkaSettings(bootstrap="127.0.0.1:9", replication_factor=3, min_insync_replicas=3)
    assert kafka.replicas_for(5) == (3, 3)
    assert KafkaSettings(bootstrap="127.0.0.1:9", replication_factor=2).replicas_for(5) == (2, 1)
    assert KafkaSettings(bootstrap="127.0.0.1:9", min_insync_replicas=1).replicas_for(3) == (3, 1)


def test_replication_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTGEN_KAFKA_REPLICATION_FACTOR", "3")
    monkeypatch.setenv("DRAFTGEN_KAFKA_MIN_INSYNC_REPLICAS", "2")
    kafka = KafkaSettings(bootstrap="127.0.0.1:9")
    assert (kafka.replication_factor, kafka.min_insync_replicas) == (3, 2)


def test_more_in_sync_than_replicas_is_refused() -> None:
    with pytest.raises(ValidationError, match="no write could be acknowledged"):
        KafkaSettings(bootstrap="127.0.0.1:9", replication_factor=2, min_insync_replicas=3)
    with pytest.raises(ValidationError):
        KafkaSettings(bootstrap="127.0.0.1:9", replication_factor=0)


def test_data_topics_get_min_insync_replicas_heartbeats_do_not() -> None:
    configs = topic_configs(KAFKA, min_insync=2)
    for name in (PROMPTS, COMPLETIONS, DEAD_LETTERS, GENERATED):
        assert configs[name]["min.insync.replicas"] == "2", name
    assert "min.insync.replicas" not in configs[WORKER_STATS]
    assert "min.insync.replicas" not in topic_configs(KAFKA)[COMPLETIONS]


def test_every_producer_is_acks_all_and_idempotent() -> None:
    kwargs = KAFKA.producer_kwargs()
    assert (kwargs["acks"], kwargs["enable_idempotence"]) == ("all", True)


def test_the_faust_producer_is_acks_all_and_idempotent() -> None:
    kafka = KAFKA.model_copy(update={"replication_factor": 3})
    app = create_app("replication-test", kafka, prefetch=4)
    assert app.conf.topic_replication_factor == 3
    assert create_app("replication-test", KAFKA, prefetch=4).conf.topic_replication_factor == 1

    async def build() -> None:
        producer = app.producer._new_producer()  # the aiokafka producer faust would start
        try:
            # idempotence is a producer with a transaction manager (and acks=all)
            assert producer._txn_manager is not None
        finally:
            await producer.client.close()

    asyncio.run(build())
