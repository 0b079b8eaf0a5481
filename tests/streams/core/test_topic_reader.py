"""The group-less topic reader and its three users (ledger, dead letters, heartbeats), against a
fake broker standing in for aiokafka's consumer and admin client. The real broker is the
integration tests' business; these check the reading logic and each user's record handling."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition

from streams.core import topic_reader, topics
from streams.core.ledger import Claim, LedgerFollower, claim_key, ledger_key
from streams.core.records import DeadLetter
from streams.core.retry import Backoff
from streams.core.settings import DEAD_LETTERS, GENERATED, WORKER_STATS, KafkaSettings
from streams.core.topic_reader import TopicReader
from streams.observe.heartbeat import HeartbeatReader, new_heartbeat
from streams.tools.progress import DeadLetterReader
from tests.polling import wait_for_async

KAFKA = KafkaSettings(bootstrap="127.0.0.1:9", topic_prefix="t-")


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int = 0
    timestamp_type: int = 0  # CreateTime (the ledger's own is LogAppendTime: test_ledger.py)


@dataclass
class FakeBroker:
    # topic -> partition -> records (offsets may have gaps: compaction) and the end offset
    logs: dict[str, dict[int, list[Record]]] = field(default_factory=dict)
    ends: dict[tuple[str, int], int] = field(default_factory=dict)
    fetch_failures: int = 0  # the next getmany calls that fail (a broker outage)
    admins: list[FakeAdmin] = field(default_factory=list)

    def create(self, topic: str, partitions: int) -> None:
        self.logs[topic] = {p: [] for p in range(partitions)}

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        offset = self.ends.get((topic, partition), 0)
        self.logs[topic][partition].append(Record(topic, partition, offset, key, value))
        self.ends[topic, partition] = offset + 1

    def compact_away(self, topic: str, partition: int, offsets: set[int]) -> None:
        records = self.logs[topic][partition]
        self.logs[topic][partition] = [r for r in records if r.offset not in offsets]


class FakeAdmin:
    def __init__(self, broker: FakeBroker):
        self.broker = broker
        self.closed = False
        self.asked: list[str] = []  # what was described: never a topic that does not exist
        broker.admins.append(self)

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        self.closed = True

    async def list_topics(self) -> list[str]:
        return list(self.broker.logs)

    async def describe_topics(self, topics: list[str]) -> list[dict[str, Any]]:
        self.asked += topics
        return [
            {
                "topic": t,
                "error_code": 0,
                "partitions": [{"partition": p} for p in self.broker.logs[t]],
            }
            for t in topics
        ]


class FakeConsumer:
    def __init__(self, broker: FakeBroker):
        self.broker = broker
        self.positions: dict[TopicPartition, int] = {}
        self.stopped = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.positions = dict.fromkeys(partitions, -1)

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self.positions[tp] = 0

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.broker.ends.get((tp.topic, tp.partition), 0) for tp in partitions}

    async def position(self, tp: TopicPartition) -> int:
        return self.positions[tp]

    async def getmany(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[Record]]:
        if self.broker.fetch_failures:
            self.broker.fetch_failures -= 1
            raise ConnectionError("broker down")
        found = {}
        for tp, position in self.positions.items():
            records = [r for r in self.broker.logs[tp.topic][tp.partition] if r.offset >= position]
            records = records[: max_records or 500]
            end = self.broker.ends.get((tp.topic, tp.partition), 0)
            # a fetch moves past offsets compaction emptied, as Kafka's batches do
            self.positions[tp] = records[-1].offset + 1 if records else max(position, end)
            if records:
                found[tp] = records
        if not found:
            await asyncio.sleep(timeout_ms / 1000)  # a long poll that found nothing
        return found


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> FakeBroker:
    fake = FakeBroker()
    monkeypatch.setattr(topic_reader, "AIOKafkaConsumer", lambda **_: FakeConsumer(fake))
    # the reader's admin calls go through topics.on_admin
    monkeypatch.setattr(topics, "AIOKafkaAdminClient", lambda **_: FakeAdmin(fake))
    return fake


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 30))


# -- the reader ---------------------------------------------------------------------------------


def test_reader_waits_for_its_topic_then_reads_every_partition_from_the_start(
    broker: FakeBroker,
) -> None:
    async def scenario() -> None:
        reader = TopicReader(KAFKA, "t-x")
        assert not await reader.open()  # not created yet: no error, try again later
        assert broker.admins[0].asked == []  # never described: that could auto-create it

        broker.create("t-x", 2)
        for i in range(3):
            broker.append("t-x", i % 2, f"k{i}".encode(), f"v{i}".encode())
        assert await reader.open()
        assert all(admin.closed for admin in broker.admins)  # not needed once assigned
        assert not await reader.caught_up()
        seen: list[tuple[int, bytes]] = []
        assert await reader.read_to_end(lambda r: seen.append((r.partition, r.key))) == 3
        assert sorted(seen) == [(0, b"k0"), (0, b"k2"), (1, b"k1")]
        assert await reader.caught_up()

        broker.append("t-x", 1, b"k3", b"v3")  # only what is new is read next time
        seen.clear()
        assert await reader.read_to_end(lambda r: seen.append((r.partition, r.key))) == 1
        assert seen == [(1, b"k3")]
        assert [r.key for r in await reader.read(timeout_ms=1)] == []
        await reader.close()

    run(scenario)


def test_caught_up_trusts_positions_past_offsets_compaction_emptied(broker: FakeBroker) -> None:
    async def scenario() -> None:
        broker.create("t-x", 1)
        for i in range(5):
            broker.append("t-x", 0, b"same", f"v{i}".encode())
        broker.compact_away("t-x", 0, {0, 1, 2, 4})  # the end (5) has no record before it
        reader = TopicReader(KAFKA, "t-x")
        assert await reader.open()
        offsets: list[int] = []
        for _ in range(3):  # no record at offset 4, yet the reader gets there
            offsets += [r.offset for r in await reader.read(timeout_ms=1)]
        assert offsets == [3]
        assert await reader.caught_up()
        await reader.close()

    run(scenario)


def test_reading_before_open_is_a_bug_not_an_empty_topic(broker: FakeBroker) -> None:
    async def scenario() -> None:
        with pytest.raises(RuntimeError, match="open"):
            await TopicReader(KAFKA, "t-x").read()

    run(scenario)


# -- its users ---------------------------------------------------------------------------------


def test_ledger_follower_reads_every_settings_then_follows_through_an_outage(
    broker: FakeBroker,
) -> None:
    async def scenario() -> None:
        topic = KAFKA.topic(GENERATED)
        broker.create(topic, 3)
        broker.append(topic, 0, ledger_key("a", "mine").encode(), b"{}")
        broker.append(topic, 1, ledger_key("b", "other").encode(), b"{}")
        broker.append(topic, 2, None, b"{}")  # a keyless record is ignored
        follower = LedgerFollower(KAFKA, poll_ms=1, backoff=Backoff(initial_s=0.001, max_s=0.002))
        await follower.start()
        await asyncio.wait_for(follower.caught_up.wait(), 5)
        # every settings: a recipe's prompts are answered under their own (core/recipes.py)
        assert follower.keys == {ledger_key("a", "mine"), ledger_key("b", "other")}

        broker.fetch_failures = 3  # an outage while following: waited out, keys kept
        broker.append(topic, 2, ledger_key("c", "mine").encode(), b"{}")

        async def has_c() -> bool:
            return follower.contains("c", "mine")

        await wait_for_async(has_c, 5, "the new ledger record", interval=0.001)
        assert broker.fetch_failures == 0 and follower.contains("a", "mine")
        await follower.stop()

    run(scenario)


async def following_an_empty_ledger(broker: FakeBroker) -> tuple[str, LedgerFollower]:
    """A ledger topic of two partitions, and a follower caught up with it."""
    topic = KAFKA.topic(GENERATED)
    broker.create(topic, 2)
    follower = LedgerFollower(KAFKA, poll_ms=1)
    await follower.start()
    await asyncio.wait_for(follower.caught_up.wait(), 5)
    return topic, follower


def test_a_claim_written_is_read_back_and_its_writer_learns_whether_it_won(
    broker: FakeBroker,
) -> None:
    """A claimant holds a prompt only once its own claim is read back from the ledger: the
    claims of one key are read in the order Kafka stored them, an earlier holder's first."""

    async def scenario() -> None:
        topic, follower = await following_an_empty_ledger(broker)
        work, now = ledger_key("p", "mine"), time.time()
        first = Claim("a", until=now + 30, at=now)
        second = Claim("b", until=now + 30, at=now + 1)
        won_first, won_second = follower.expect(work, first), follower.expect(work, second)
        broker.append(topic, 1, claim_key(work).encode(), first.encode())
        broker.append(topic, 1, claim_key(work).encode(), second.encode())
        assert await asyncio.wait_for(won_first, 5) is True
        assert await asyncio.wait_for(won_second, 5) is False  # "a" held it, not lapsed
        assert follower.holder(work) == first
        await follower.stop()

    run(scenario)


def test_ledger_follower_of_an_empty_or_missing_ledger_is_caught_up_at_once(
    broker: FakeBroker,
) -> None:
    async def scenario() -> None:
        missing = LedgerFollower(KAFKA)
        await missing.start()
        assert missing.caught_up.is_set()
        await missing.stop()

        broker.create(KAFKA.topic(GENERATED), 4)
        empty = LedgerFollower(KAFKA, poll_ms=1)
        await empty.start()
        await asyncio.wait_for(empty.caught_up.wait(), 5)
        await empty.stop()

    run(scenario)


def test_dead_letter_reader_tallies_what_is_new_at_each_poll(broker: FakeBroker) -> None:
    async def scenario() -> None:
        reader = DeadLetterReader(KAFKA, keep_letters=True)
        assert (await reader.poll()).by_reason == {}  # no topic yet
        topic = KAFKA.topic(DEAD_LETTERS)
        broker.create(topic, 2)
        letter = DeadLetter.for_payload("generate", "http_400", "bad", b"{}", "p1")
        broker.append(topic, 0, b"p1", letter.encode())
        broker.append(topic, 1, b"?", b"not a dead letter")
        tally = await reader.poll()
        assert tally.by_reason == {("generate", "http_400"): 1, ("?", "undecodable_dead_letter"): 1}
        assert tally.prompt_ids == {"p1"} and len(tally.letters) == 1

        drop = DeadLetter.for_payload("tokenize", "policy_length", "cut", b"{}", "p2")
        broker.append(topic, 1, b"p2", drop.encode())
        tally = await reader.poll()
        assert tally.prompt_ids == {"p1", "p2"} and tally.policy_ids == {"p2"}
        assert sum(tally.by_reason.values()) == 3  # nothing counted twice
        await reader.close()

    run(scenario)


def test_heartbeat_reader_keeps_the_latest_beat_per_worker(broker: FakeBroker) -> None:
    async def scenario() -> None:
        reader = HeartbeatReader(KAFKA)
        assert await reader.poll() == {}
        topic = KAFKA.topic(WORKER_STATS)
        broker.create(topic, 1)
        first = new_heartbeat("generate", "http://s1", 5.0, None)
        first.counters = {"completed": 1}
        broker.append(topic, 0, b"w1", first.encode())
        first.counters = {"completed": 2}
        broker.append(topic, 0, b"w1", first.encode())
        broker.append(topic, 0, b"w2", new_heartbeat("tokenize", "ds", 5.0, None).encode())
        beats = await reader.poll()
        assert set(beats) == {"w1", "w2"} and beats["w1"].counters == {"completed": 2}

        broker.append(topic, 0, b"w2", None)  # a graceful stop's tombstone
        assert set(await reader.poll()) == {"w1"}
        await reader.close()

    run(scenario)
