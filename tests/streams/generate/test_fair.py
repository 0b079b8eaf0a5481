"""Partitions served in turns (streams/generate/fair.py), against a model of how faust and
aiokafka hand out fetched records: partitions in fetch-buffer order, the first one with
records not held drained up to `max_records` a call; a held partition's records already
handed out still arrive."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

from streams.generate.fair import FairTurns

PREFETCH = 4  # max_poll_records: records a call hands out


class TP(NamedTuple):
    """faust's partition type: the only one its consumer's active set may hold."""

    topic: str
    partition: int


@dataclass(frozen=True)
class MessageTP:
    """A consumed message's partition (aiokafka's type, not faust's)."""

    topic: str
    partition: int


class Fetcher:
    """faust's consumer as FairTurns sees it, over a backlog fetched at once (one fetch result
    per partition, in partition order, as aiokafka's buffer holds them)."""

    def __init__(self, backlog: dict[int, int]) -> None:
        self.records = {TP("prompts", p): deque(range(n)) for p, n in backlog.items()}
        self.ends = {TP("prompts", p): n for p, n in backlog.items()}  # the highwaters
        self.active = set(self.records)
        self.assigned = set(self.records)

    def assignment(self) -> set[TP]:
        return self.assigned

    def highwater(self, tp: Any) -> int | None:
        assert tp in self.assigned, "Partition is not assigned"  # as aiokafka's consumer
        return self.ends[tp]

    def on_buffer_full(self, tp: Any) -> None:
        assert isinstance(tp, TP)  # as faust's consumer asserts, later
        self.active.discard(tp)

    def on_buffer_drop(self, tp: Any) -> None:
        assert isinstance(tp, TP)
        self.active.add(tp)

    def publish(self, partition: int, count: int = 1) -> None:
        tp = TP("prompts", partition)
        self.records[tp].extend(range(self.ends[tp], self.ends[tp] + count))
        self.ends[tp] += count

    def getmany(self) -> list[tuple[MessageTP, int]]:
        batch: list[tuple[MessageTP, int]] = []
        for tp in sorted(self.records):
            queue = self.records[tp]
            while tp in self.active and queue and len(batch) < PREFETCH:
                batch.append((MessageTP(tp.topic, tp.partition), queue.popleft()))
            if len(batch) == PREFETCH:
                break
        return batch


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def serve(fetcher: Fetcher, turns: FairTurns | None, clock: Clock, limit: int) -> list[int]:
    """The partitions of the first `limit` prompts taken, in order. A call that hands out
    nothing is the agent waiting: the clock moves past the grace and the idle check runs."""
    order: list[int] = []
    while len(order) < limit:
        batch = fetcher.getmany()
        if not batch:
            if turns is None or not turns.held:
                break
            clock.now += turns.grace_s + 0.1
            turns.idle_check()
            continue
        for tp, offset in batch:  # all of a batch arrives, held meanwhile or not
            if turns is not None:
                turns.took(tp, offset)
            order.append(tp.partition)
    return order


def first_turns(order: list[int]) -> dict[int, int]:
    """How many prompts were taken before each partition's first."""
    first: dict[int, int] = {}
    for index, tp in enumerate(order):
        first.setdefault(tp, index)
    return first


def turns_for(fetcher: Fetcher, clock: Clock) -> FairTurns:
    turns = FairTurns(lambda: fetcher, grace_s=0.5, clock=clock)
    turns._waiting_since = clock.now  # the agent waits for its next prompt
    return turns


def test_without_turns_a_backlog_is_served_one_partition_after_another() -> None:
    # what the fix is for: the fetcher alone gives partition 7 its first turn after 7 × 50
    fetcher = Fetcher({tp: 50 for tp in range(8)})
    assert first_turns(serve(fetcher, None, Clock(), 400))[7] == 350


def test_every_partition_gets_a_turn_each_round() -> None:
    clock = Clock()
    fetcher = Fetcher({tp: 50 for tp in range(8)})
    turns = turns_for(fetcher, clock)
    order = serve(fetcher, turns, clock, 400)
    first = first_turns(order)
    assert sorted(first) == list(range(8))
    assert max(first.values()) < 8 * PREFETCH  # within the first round
    # and every round: in any 8 × PREFETCH prompts, every partition appears
    for start in range(0, 320, 8 * PREFETCH):
        assert set(order[start : start + 8 * PREFETCH]) == set(range(8)), start
    assert sorted(order) == sorted(tp for tp in range(8) for _ in range(50))  # none skipped
    assert clock.now == 0.0  # no round waited for the grace: each had its partitions


def test_a_partition_with_nothing_waiting_does_not_hold_up_the_rounds() -> None:
    clock = Clock()
    fetcher = Fetcher({0: 40, 1: 40, 2: 0})  # partition 2 is caught up: never delivers
    turns = turns_for(fetcher, clock)
    order = serve(fetcher, turns, clock, 80)
    assert sorted(order) == [0] * 40 + [1] * 40
    # waited for once (it may have had a backlog), then not until something is published
    assert clock.now == 0.6
    fetcher.publish(2)
    rounds = turns.rounds
    tail = serve(fetcher, turns, clock, 1)
    assert tail == [2] and turns.rounds == rounds + 1


def test_a_rebalance_forgets_what_it_knew_of_the_partitions() -> None:
    clock = Clock()
    fetcher = Fetcher({0: 10, 1: 10})
    turns = turns_for(fetcher, clock)
    first, second = TP("prompts", 0), TP("prompts", 1)
    turns.took(MessageTP("prompts", 0), 0)
    assert turns.held == {first}  # partition 1 still waits for its turn
    fetcher.assigned = {second}
    fetcher.active = {second}
    turns.took(MessageTP("prompts", 1), 0)
    # partition 0 is gone; partition 1, the only one, starts the next round at once
    assert turns.held == set() and fetcher.active == {second}


def test_partitions_revoked_between_events_neither_stop_the_idle_check_nor_come_back() -> None:
    """A rebalance with no event since: the idle check must not ask for the highwater of a
    partition no longer assigned (aiokafka asserts; it crashed a worker), nor release a
    revoked one (faust would make it active again)."""
    clock = Clock()
    fetcher = Fetcher({0: 10, 1: 0, 2: 0})
    turns = turns_for(fetcher, clock)
    turns.took(MessageTP("prompts", 0), 0)
    assert turns.held == {TP("prompts", 0)}
    fetcher.assigned = {TP("prompts", 2)}  # 0 and 1 revoked
    fetcher.active = {TP("prompts", 2)}
    clock.now += turns.grace_s + 0.1
    turns.idle_check()
    assert turns.held == set() and turns.rounds == 1
    assert fetcher.active == {TP("prompts", 2)}
