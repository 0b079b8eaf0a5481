"""Durable on a real Kafka cluster: three brokers on loopback (one KRaft quorum) with
`min.insync.replicas=2` and `default.replication.factor=3`. A run with generate and tokenize
workers loses one broker to kill -9 mid-run (started again later) and has another stopped
briefly: every prompt still ends as exactly one sample or recorded drop of the sealed version,
the reader returns nothing twice, and the completions topic holds every completion (a replay
after the faults rebuilds the same version). The topics read back from the cluster show 3
replicas and min.insync.replicas=2; an existing topic with fewer gets one warning."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from compose.kafka import KafkaBroker, KafkaCluster
from compose.seaweedfs import SeaweedS3
from compose.stack import LocalStack
from sinks.reader import DatasetReader, open_dataset
from streams.core.settings import COMPLETIONS, PROMPTS, KafkaSettings
from streams.core.topics import DATA_TOPICS, config_values, ensure_topics, topic_configs
from streams.tools.seal import seal
from tests.integration.conftest import Pipeline
from tests.integration.probes import topic_size
from tests.polling import wait_for

pytestmark = pytest.mark.integration

PROMPT_BATCH = 40
# what asking the cluster may raise while a broker is gone: "not yet", for a wait
KAFKA_ERRORS = (KafkaError, OSError, asyncio.TimeoutError)
# slow enough that work is in flight when a broker goes, fast enough for a short test
EMULATOR = (
    *("--tokens-per-s", "80", "--min-output-tokens", "16", "--mean-output-tokens", "60"),
    *("--max-output-tokens", "400", "--seed", "0"),
)


class Cluster:
    """The module's three brokers, shared by its tests, and the session's S3."""

    def __init__(self, stack: LocalStack, kafka: KafkaCluster, s3: SeaweedS3):
        self.stack, self.kafka, self.s3 = stack, kafka, s3

    def env(self) -> dict[str, str]:
        endpoint = self.s3.endpoint
        return {
            "DRAFTGEN_S3_ENDPOINT_URL": endpoint.endpoint_url,
            "DRAFTGEN_S3_ACCESS_KEY": endpoint.access_key,
            "DRAFTGEN_S3_SECRET_KEY": endpoint.secret_key,
            "DRAFTGEN_KAFKA_SESSION_TIMEOUT_S": "10",
        }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, s3: SeaweedS3) -> Iterator[Cluster]:
    stack = LocalStack(tmp_path_factory.mktemp("cluster"), forked=True)
    try:
        yield Cluster(stack, stack.start_kafka_cluster(3, min_insync=2), s3)
    finally:
        # thrown away with the module: SIGKILL, not the controlled shutdown of three brokers
        # stopping together (each waits for a quorum that is stopping too: ~9 s)
        if stack.kafka_cluster is not None:
            for node in stack.kafka_cluster.nodes:
                node.kill()
        stack.stop_all()


@pytest.fixture
def on_cluster(
    cluster: Cluster, stack: LocalStack, topic_prefix: str, qwen_tokenizer_dir: Path
) -> Pipeline:
    return Pipeline(
        stack, cluster.kafka.bootstrap, cluster.s3, cluster.env(), topic_prefix, qwen_tokenizer_dir
    )


async def _describe(
    kafka: KafkaSettings, names: list[str]
) -> tuple[list[Any], dict[str, str | None]]:
    """The topics' metadata, and each one's min.insync.replicas as the cluster reports it."""
    admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
    await admin.start()
    try:
        topics = await admin.describe_topics(names)
        resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
        described = await admin.describe_configs(resources)
        return topics, config_values(described, "min.insync.replicas")
    finally:
        await admin.close()


def _with_partitions(
    kafka: KafkaSettings, names: list[str]
) -> tuple[list[Any], dict[str, str | None]] | None:
    """`_describe`, once every topic is described with its partitions (else None)."""
    topics, insync = asyncio.run(_describe(kafka, names))
    return (topics, insync) if all(topic.get("partitions") for topic in topics) else None


def pipeline_topics(kafka: KafkaSettings) -> list[str]:
    return [kafka.topic(name) for name in topic_configs(kafka)]


def fully_replicated(kafka: KafkaSettings) -> bool:
    """Every partition of the pipeline's topics has all 3 replicas in sync."""
    topics, _ = asyncio.run(_describe(kafka, pipeline_topics(kafka)))
    partitions = [p for topic in topics for p in topic.get("partitions") or []]
    return len(topics) == len(pipeline_topics(kafka)) and all(
        len(p["isr"]) == 3 for p in partitions
    )


def most_leaders(nodes: list[KafkaBroker], kafka: KafkaSettings) -> KafkaBroker:
    """The node leading the most completions partitions: the one whose loss moves most."""
    [topic], _ = asyncio.run(_describe(kafka, [kafka.topic(COMPLETIONS)]))
    leaders = [p["leader"] for p in topic["partitions"]]
    return max(nodes, key=lambda node: leaders.count(node.node_id))


def test_a_broker_lost_mid_run_loses_nothing(
    cluster: Cluster, on_cluster: Pipeline, write_prompts: Any
) -> None:
    pipeline, kafka = on_cluster, on_cluster.kafka
    url, _ = pipeline.emulator(*EMULATOR)
    generate = pipeline.generate(url, "--concurrency", "8")
    tokenize = pipeline.tokenize()
    workers = [generate, tokenize]

    # the topics, created by the workers as the settings say for three brokers
    topics = pipeline_topics(kafka)
    wait_for(lambda: set(topics) <= set(_existing(kafka)), 120, "the workers to create the topics")
    # a topic just created may be listed before its partitions are known to the broker asked
    described, insync = wait_for(
        lambda: _with_partitions(kafka, topics), 60, "the topics' partitions", ignore=KAFKA_ERRORS
    )
    for topic in described:
        assert {len(p["replicas"]) for p in topic["partitions"]} == {3}, topic["topic"]
    assert {name: insync[kafka.topic(name)] for name in DATA_TOPICS} == dict.fromkeys(
        DATA_TOPICS, "2"
    )

    expected = set(pipeline.publish(write_prompts(PROMPT_BATCH)).prompt_ids)
    wait_for(lambda: topic_size(kafka) >= 8, 120, "the first completions")

    # mid-run, with requests in flight: the busiest broker lost outright
    lost = most_leaders(cluster.kafka.nodes, kafka)
    lost.kill()
    more = write_prompts(PROMPT_BATCH, name="during-loss.jsonl", start=1000)
    expected |= set(pipeline.publish(more).prompt_ids)  # two brokers take the writes
    wait_for(
        lambda: topic_size(kafka) >= PROMPT_BATCH + 8,
        180,
        "completions without it",
        ignore=KAFKA_ERRORS,
    )
    lost.restart()
    wait_for(
        lambda: fully_replicated(kafka), 120, "the lost broker back in sync", ignore=KAFKA_ERRORS
    )

    # another one stopped (SIGTERM: a controlled shutdown) briefly, while work goes on
    stopped = most_leaders([node for node in cluster.kafka.nodes if node is not lost], kafka)
    later = write_prompts(PROMPT_BATCH, name="during-stop.jsonl", start=2000)
    expected |= set(pipeline.publish(later).prompt_ids)
    stopped.stop()
    wait_for(
        lambda: topic_size(kafka) >= 2 * PROMPT_BATCH + 8,
        180,
        "completions without it",
        ignore=KAFKA_ERRORS,
    )
    stopped.restart()

    pipeline.wait(expected, workers, timeout=240)
    sealed = asyncio.run(seal(kafka, pipeline.store(), timeout_s=120))

    # every prompt exactly once: a sample or a recorded drop of the sealed version
    rows = open_dataset(f"{pipeline.out}/{pipeline.dataset}", cluster.s3.endpoint.storage_options())
    table = rows.table()
    ids = table["prompt_id"].to_pylist()
    assert len(ids) == len(set(ids)), "a prompt twice in what the reader returns"
    assert not set(ids) & set(sealed.dropped)
    assert set(ids) | set(sealed.dropped) == expected
    pipeline.assert_exactly_once(expected)

    # the completions topic holds every completion: a replay rebuilds the same version
    assert set(pipeline.completions()) == expected
    replay = pipeline.replay("replayed")
    pipeline.wait(expected, [replay], timeout=120, dataset="replayed")
    resealed = asyncio.run(seal(kafka, pipeline.store("replayed"), timeout_s=120))
    assert resealed.dropped == sealed.dropped
    assert _samples(pipeline, "replayed") == _samples(pipeline, pipeline.dataset)

    # nobody was told the topics keep fewer copies than asked
    for worker in (generate, tokenize):
        assert "fewer copies than asked" not in worker.log_path.read_text(errors="replace")


def _samples(pipeline: Pipeline, dataset: str) -> dict[str, tuple[list[int], list[int]]]:
    table = DatasetReader(pipeline.store(dataset)).table()
    return {
        row["prompt_id"]: (list(row["input_ids"]), list(row["loss_mask"]))
        for row in table.select(["prompt_id", "input_ids", "loss_mask"]).to_pylist()
    }


def _existing(kafka: KafkaSettings) -> list[str]:
    async def listed() -> list[str]:
        admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
        await admin.start()
        try:
            return list(await admin.list_topics())
        finally:
            await admin.close()

    return asyncio.run(listed())


def test_an_existing_topic_with_fewer_replicas_gets_one_warning(
    cluster: Cluster, topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    kafka = KafkaSettings(
        bootstrap=cluster.kafka.bootstrap, topic_prefix=topic_prefix, partitions=2
    )

    async def create_small() -> None:
        admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
        await admin.start()
        try:  # created by someone else, before: one copy
            await admin.create_topics([NewTopic(kafka.topic(PROMPTS), 2, 1)])
        finally:
            await admin.close()

    asyncio.run(create_small())
    with caplog.at_level(logging.WARNING, logger="streams.core.topics"):
        resolved = asyncio.run(ensure_topics(kafka))
    assert (resolved.replication_factor, resolved.min_insync_replicas) == (3, 2)
    [warning] = [r.getMessage() for r in caplog.records if r.name == "streams.core.topics"]
    assert f"{kafka.topic(PROMPTS)} (1 replicas)" in warning
    assert f"{kafka.topic(PROMPTS)} (min.insync.replicas 2)" not in warning  # the broker's
    # never a silent downgrade, never a change: the topic keeps its one copy
    [topic], _ = asyncio.run(_describe(kafka, [kafka.topic(PROMPTS)]))
    assert {len(p["replicas"]) for p in topic["partitions"]} == {1}
    # the others were created with three
    [completions], _ = asyncio.run(_describe(kafka, [kafka.topic(COMPLETIONS)]))
    assert {len(p["replicas"]) for p in completions["partitions"]} == {3}
