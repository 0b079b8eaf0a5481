"""Create the pipeline's topics explicitly (never rely on broker auto-creation), replicated.

Every topic gets the replication factor of the settings (default min(3, brokers in the
cluster)), and the topics that hold data (prompts, completions, dead letters, the ledger) a
`min.insync.replicas` (default one less, at least 1): with the producers' acks=all a write is
acknowledged once that many replicas hold it, so losing a broker loses nothing acknowledged,
and one broker down does not stop the writes. A topic that exists already is never changed:
one with fewer replicas (or a lower min.insync.replicas) than asked gets one warning at start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    InvalidReplicationFactorError,
    KafkaError,
    TopicAlreadyExistsError,
    for_code,
)
from aiokafka.protocol.api import Response

from streams.core.errors import CliError
from streams.core.retry import backoff as retry_backoff
from streams.core.retry import short_error
from streams.core.settings import (
    COMPLETIONS,
    DEAD_LETTERS,
    GENERATED,
    PROMPTS,
    WORKER_STATS,
    KafkaSettings,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
# how long an admin request that hit a lost broker is retried (fencing one takes ~10 s)
ADMIN_RETRY_S = 60.0


# Topics whose records are the run's data: a write to them needs min.insync.replicas copies.
# Heartbeats (worker-stats) are not data: replicated, but written with one copy in sync.
DATA_TOPICS = (PROMPTS, COMPLETIONS, DEAD_LETTERS, GENERATED)
# a day: a claim lives seconds to minutes (--claim-s, renewed while its request runs)
LEDGER_COMPACTION_LAG_MS = 24 * 3600 * 1000


def topic_configs(kafka: KafkaSettings, min_insync: int | None = None) -> dict[str, dict[str, str]]:
    """Each topic's configuration at creation; `min_insync` goes to the data topics."""
    max_bytes = str(kafka.topic_max_message_bytes)
    configs = {
        PROMPTS: {"retention.ms": str(30 * 24 * 3600 * 1000), "max.message.bytes": max_bytes},
        # The source of truth for replay: kept forever.
        COMPLETIONS: {
            "retention.ms": "-1",
            "retention.bytes": "-1",
            "max.message.bytes": max_bytes,
        },
        DEAD_LETTERS: {"retention.ms": str(90 * 24 * 3600 * 1000), "max.message.bytes": max_bytes},
        # Latest heartbeat per worker: short segments, compacted eagerly, so `status` reads
        # little more than one record per worker.
        WORKER_STATS: {
            "cleanup.policy": "compact",
            "segment.ms": str(10 * 60 * 1000),
            "min.cleanable.dirty.ratio": "0.1",
        },
        # What was generated, per prompt and settings: compacted, never deleted (core/ledger.py).
        # Claims are judged on the broker's append time, so hosts' clocks need not agree, and
        # no record is compacted away while a claim of it may be live (a later reader would
        # see a losing claimant's record without its holder's): far above any claim time.
        GENERATED: {
            "cleanup.policy": "compact",
            "retention.ms": "-1",
            "message.timestamp.type": "LogAppendTime",
            "min.compaction.lag.ms": str(LEDGER_COMPACTION_LAG_MS),
        },
    }
    if min_insync is not None:
        for name in DATA_TOPICS:
            configs[name]["min.insync.replicas"] = str(min_insync)
    return configs


# Heartbeats are a few per second at most: one partition keeps `status` reads cheap.
_PARTITIONS = {WORKER_STATS: 1}


async def ensure_topics(kafka: KafkaSettings) -> KafkaSettings:
    """Create missing topics, replicated; returns `kafka` with the replication factor and
    min.insync.replicas resolved for this cluster (what faust's own topics take too)."""
    return await on_admin(kafka, "creating topics", lambda admin: _ensure(admin, kafka))


async def _ensure(admin: AIOKafkaAdminClient, kafka: KafkaSettings) -> KafkaSettings:
    brokers = len((await admin.describe_cluster()).get("brokers") or ()) or 1
    replicas, insync = kafka.replicas_for(brokers)
    if insync > replicas:
        raise CliError(
            f"min.insync.replicas {insync} is more than the {replicas} replicas of the "
            "topics: no write could be acknowledged (DRAFTGEN_KAFKA_MIN_INSYNC_REPLICAS)"
        )
    if replicas > brokers:
        raise CliError(
            f"replication factor {replicas} needs {replicas} brokers; the cluster at "
            f"{kafka.bootstrap} has {brokers} (DRAFTGEN_KAFKA_REPLICATION_FACTOR)"
        )
    existing = set(await admin.list_topics())
    configs = topic_configs(kafka, insync)
    wanted = [
        NewTopic(
            kafka.topic(name),
            _PARTITIONS.get(name, kafka.partitions),
            replicas,
            topic_configs=config,
        )
        for name, config in configs.items()
        if kafka.topic(name) not in existing
    ]
    present = [kafka.topic(name) for name in configs if kafka.topic(name) in existing]
    if present:
        await _warn_if_less_durable(admin, kafka, present, replicas, insync)
    if wanted:
        _check_created(await admin.create_topics(wanted), kafka, replicas)
        log.info(
            "created topics %s (%d replicas, min.insync.replicas %d for data)",
            ", ".join(t.name for t in wanted),
            replicas,
            insync,
        )
        await _wait_for_leaders(admin, [t.name for t in wanted])
    return kafka.model_copy(update={"replication_factor": replicas, "min_insync_replicas": insync})


async def on_admin(
    kafka: KafkaSettings, what: str, work: Callable[[AIOKafkaAdminClient], Awaitable[T]]
) -> T:
    """`work` with an admin client. Once connected, a retriable error is retried for a while:
    the client asks a random broker, which on a cluster may be one just lost and not yet
    fenced (seconds). A cluster that cannot be reached at all fails at once, as before."""
    backoff = retry_backoff("poll")
    deadline = time.monotonic() + ADMIN_RETRY_S
    attempt = 0
    while True:
        admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
        await admin.start()
        try:
            return await work(admin)
        except KafkaError as err:
            if not err.retriable or time.monotonic() >= deadline:
                raise
            attempt += 1
            if attempt == 1:
                log.warning("%s: %s; retrying (a broker lost?)", what, short_error(err))
        finally:
            await admin.close()
        await backoff.sleep(attempt)


def _check_created(response: Any, kafka: KafkaSettings, replicas: int) -> None:
    """aiokafka returns the broker's per-topic errors rather than raising them: a topic that
    another process created first is fine, any other refusal stops the start with one line."""
    for topic, code, *detail in response.topic_errors:  # (name, error code[, message])
        error = for_code(code) if code else None
        if error is None or error is TopicAlreadyExistsError:
            continue
        why = detail[0] if detail and detail[0] else error.__name__
        if error is InvalidReplicationFactorError:
            why = f"{why}; fewer brokers are up than {replicas} (DRAFTGEN_KAFKA_REPLICATION_FACTOR)"
        raise CliError(f"the cluster at {kafka.bootstrap} refused to create topic {topic}: {why}")


async def _warn_if_less_durable(
    admin: AIOKafkaAdminClient, kafka: KafkaSettings, names: list[str], replicas: int, insync: int
) -> None:
    """One warning for the existing topics that keep fewer copies than asked: they are not
    changed here (that is a partition reassignment, an operator's decision)."""
    short: list[str] = []
    for topic in await admin.describe_topics(names):
        partitions = topic.get("partitions") or []
        if not partitions:
            continue
        fewest = min(len(p.get("replicas") or ()) for p in partitions)
        if fewest < replicas:
            short.append(f"{topic['topic']} ({fewest} replicas)")
    data = {kafka.topic(name) for name in DATA_TOPICS}
    for name, value in (await _topic_config(admin, [n for n in names if n in data])).items():
        if value is not None and int(value) < insync:
            short.append(f"{name} (min.insync.replicas {value})")
    if short:
        log.warning(
            "existing topics keep fewer copies than asked (%d replicas, min.insync.replicas "
            "%d): %s; a lost broker can lose their records. They are left as they are: add "
            "replicas with kafka-reassign-partitions and raise min.insync.replicas with "
            "kafka-configs, or set DRAFTGEN_KAFKA_REPLICATION_FACTOR / "
            "DRAFTGEN_KAFKA_MIN_INSYNC_REPLICAS to what they have",
            replicas,
            insync,
            ", ".join(short),
        )


async def _topic_config(
    admin: AIOKafkaAdminClient, names: list[str], key: str = "min.insync.replicas"
) -> dict[str, str | None]:
    """One config value of each topic (None where it is not reported)."""
    if not names:
        return {}
    resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
    found = config_values(await admin.describe_configs(resources), key)
    return {name: found.get(name) for name in names}


# -- aiokafka's admin responses, read by field name in this one place ----------------------------
# The admin client returns the raw protocol responses, whose nested entries are tuples in the
# wire schema's order; `Response.to_object()` (public) names their fields, so a schema version
# that adds or moves a field does not shift what we read.


def config_values(responses: Iterable[Response], key: str) -> dict[str, str | None]:
    """Each described resource's value of the config `key` (from `describe_configs`)."""
    found: dict[str, str | None] = {}
    for response in responses:
        for resource in response.to_object()["resources"]:
            for entry in resource["config_entries"]:
                if entry["config_names"] == key:
                    found[resource["resource_name"]] = entry["config_value"]
    return found


@dataclass(frozen=True)
class GroupState:
    """One consumer group as `describe_consumer_groups` reports it."""

    group: str
    state: str
    members: int


def group_states(responses: Iterable[Response]) -> list[GroupState]:
    """The groups of `describe_consumer_groups`' responses."""
    return [
        GroupState(group["group"], group["state"], len(group["members"]))
        for response in responses
        for group in response.to_object()["groups"]
    ]


def group_names(listed: Iterable[tuple[Any, ...]]) -> set[str]:
    """The names of `list_consumer_groups`' (name, protocol type) pairs."""
    return {str(name) for name, _protocol_type in listed}


async def prepare_topics(kafka: KafkaSettings) -> KafkaSettings:
    """What a command that writes does at start: the topics created (`ensure_topics`), and
    `kafka` with the replication resolved and the message limit the topics accept."""
    return await within_topic_limits(await ensure_topics(kafka))


async def within_topic_limits(kafka: KafkaSettings) -> KafkaSettings:
    """`kafka` with its message limit lowered to what the pipeline's existing topics accept:
    a topic created elsewhere, or before DRAFTGEN_KAFKA_MAX_MESSAGE_BYTES was raised, keeps its
    own max.message.bytes. Checking against it up front beats a refusal by the broker, which
    an idempotent producer cannot get past (the partition's later batches then fail with
    OutOfOrderSequenceNumber)."""
    names = [kafka.topic(name) for name in (PROMPTS, COMPLETIONS, DEAD_LETTERS)]
    resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
    responses = await on_admin(
        kafka, "reading the topics' limits", lambda admin: admin.describe_configs(resources)
    )
    lowest = kafka.max_message_bytes
    for value in config_values(responses, "max.message.bytes").values():
        if value is not None:
            topic = int(value)
            # the topic checks the compressed batch, which gzip can make a little larger
            lowest = min(lowest, topic - topic // 8192 - 1024)
    if lowest == kafka.max_message_bytes:
        return kafka
    log.info("a topic accepts less than DRAFTGEN_KAFKA_MAX_MESSAGE_BYTES: limit %d bytes", lowest)
    return kafka.model_copy(update={"max_message_bytes": lowest})


async def _wait_for_leaders(
    admin: AIOKafkaAdminClient, topics: list[str], timeout: float = 30
) -> None:
    """New partitions have no leader for a moment; writing then only produces retry noise."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        described = await admin.describe_topics(topics)
        if all(
            topic.get("partitions") and all(p.get("leader", -1) >= 0 for p in topic["partitions"])
            for topic in described
        ):
            return
        await asyncio.sleep(0.2)
