"""The prompts topic's backlogs as a thief reads them (streams/generate/backlogs.py), against the
fake broker of the topic reader's tests with a consumer group's committed offsets added: every
partition has a backlog, from the group's committed offset or, where nothing is committed yet,
from the log's start; and a thief takes from one."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from streams.core import topic_reader
from streams.core.settings import OnceSettings
from streams.generate import backlogs as backlogs_module
from streams.generate.backlogs import KafkaBacklogs
from streams.generate.steal import Stealer
from tests.streams.core.test_topic_reader import (
    KAFKA,
    FakeAdmin,
    FakeBroker,
    FakeConsumer,
    Record,
)
from tests.streams.generate.fakes import (
    COMPLETIONS,
    FakeClient,
    FakeKafka,
    once_worker,
    prompt,
    run,
    until,
)

TOPIC = KAFKA.topic("prompts")
GROUP = KAFKA.group("generate")


@dataclass
class GroupBroker(FakeBroker):
    committed: dict[tuple[str, int], int] = field(default_factory=dict)  # the group's
    starts: dict[tuple[str, int], int] = field(default_factory=dict)  # retention deleted below


class GroupAdmin(FakeAdmin):
    broker: GroupBroker

    async def list_consumer_group_offsets(
        self, group: str, partitions: list[TopicPartition] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        # as Kafka answers: a partition nothing was committed for is left out, unless named,
        # then it comes with offset -1
        assert group == GROUP
        committed = self.broker.committed
        named = partitions or [TopicPartition(t, p) for t, p in committed]
        return {tp: OffsetAndMetadata(committed.get(tp, -1), "") for tp in named}


class LogConsumer(FakeConsumer):
    broker: GroupBroker

    async def beginning_offsets(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, int]:
        return {tp: self.broker.starts.get((tp.topic, tp.partition), 0) for tp in partitions}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp] = offset

    async def getmany(  # aiokafka's takes the partitions first
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[Record]]:
        return await super().getmany(timeout_ms, max_records)


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> GroupBroker:
    fake = GroupBroker()
    monkeypatch.setattr(topic_reader, "AIOKafkaConsumer", lambda **_: LogConsumer(fake))
    monkeypatch.setattr(backlogs_module, "AIOKafkaAdminClient", lambda **_: GroupAdmin(fake))
    return fake


def published(broker: GroupBroker, counts: list[int]) -> None:
    """The prompts topic, `counts[p]` prompts in partition p, each named `p{p}-{offset}`."""
    broker.create(TOPIC, len(counts))
    for partition, count in enumerate(counts):
        for offset in range(count):
            pid = f"p{partition}-{offset}"
            broker.append(TOPIC, partition, pid.encode(), prompt(pid))


def test_every_partition_has_a_backlog_even_one_nothing_was_committed_for(
    broker: GroupBroker,
) -> None:
    async def scenario() -> None:
        published(broker, [5, 5, 5])
        broker.committed[TOPIC, 0] = 2
        broker.committed[TOPIC, 2] = 1
        broker.starts[TOPIC, 2] = 3  # retention deleted the records under the commit
        broker.committed["other-topic", 0] = 7  # the group's offsets of another topic
        backlogs = KafkaBacklogs(KAFKA, TOPIC, GROUP)

        # partition 1: nothing committed yet (its owner finished no prompt): from its start
        assert await backlogs.committed() == {0: 2, 1: 0, 2: 3}
        assert await backlogs.ends([0, 1]) == {0: 5, 1: 5}
        assert [key for key, _ in await backlogs.read(1, {1, 3})] == [b"p1-1", b"p1-3"]
        await backlogs.close()

    run(scenario)


def test_a_thief_takes_from_a_backlog_nothing_was_committed_for(broker: GroupBroker) -> None:
    """An owner whose server was down from the start of a run commits nothing: its backlog is
    the whole partition, and idle servers take it."""

    async def scenario() -> None:
        published(broker, [4, 3])
        broker.committed[TOPIC, 0] = 4  # the thief's own partition: all done
        client, kafka = FakeClient(), FakeKafka()
        worker, _ = await once_worker(client, kafka, concurrency=2)
        stealer = Stealer(worker, KafkaBacklogs(KAFKA, TOPIC, GROUP), OnceSettings(), lambda: {0})

        assert await stealer.steal_once() == 2
        await until(lambda: worker.stats.stolen == 2, "both generated here")
        assert sorted(kafka.sent_to(COMPLETIONS)) == ["p1-1", "p1-2"]
        await stealer.backlogs.close()
        await worker.stop()

    run(scenario)
