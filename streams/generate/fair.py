"""A generate worker's partitions served in turns, so that a backlog on some partitions does
not hold back the oldest prompts of the others.

Why it is needed: aiokafka's fetcher hands out what it fetched partition by partition, in the
order of its fetch buffer, up to `max_poll_records` records a call; the partition first in that
order keeps being drained until its whole fetch (up to the fetch size, the topic's message limit:
thousands of short prompts) is used up, and only then is it fetched again, behind the others.
Faust's round-robin interleaves partitions only within one such call (a few records of one
partition). With a backlog a worker served its partitions one after another: the last one's
oldest prompt waited for the whole backlog of the first ones.

What it does: once a partition has had its turn (a prompt taken), it is held until every
partition with prompts waiting has had one; then the next round starts. The hold is faust's own
(`Consumer.on_buffer_full`, which faust puts on a partition whose stream buffer is full): the
fetcher stops handing out that partition's records and keeps them, while records of it already
being delivered still arrive, so nothing is skipped (`pause_partitions` would drop those). The
release is `on_buffer_drop`. Which partitions still wait comes from the highwater the fetcher
knows against the next offset taken here; a partition that delivered nothing this worker has
seen (caught up, or not fetched yet) stops being waited for after `grace_s` without a record,
until its highwater grows. Offsets, acks and the order within a partition are untouched
(streams/generate/inflight.py), and so is stealing (streams/generate/steal.py).

Why faust's buffer hooks, the one place this package relies on them: faust has no public way to
hold a partition without dropping records already handed out, and these two methods are what
faust's own conductor calls for exactly that (its stream buffers). They are public methods of
faust's Consumer but not documented; tests/streams/generate/test_fair_faust.py fails if the
installed faust renames them, changes their signature, or stops using them so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any, Protocol


class Partitions(Protocol):
    """What this needs of faust's consumer (`app.consumer`)."""

    def assignment(self) -> Iterable[Any]: ...
    def highwater(self, tp: Any) -> int | None: ...
    def on_buffer_full(self, tp: Any) -> None: ...
    def on_buffer_drop(self, tp: Any) -> None: ...


class FairTurns:
    def __init__(
        self,
        consumer: Callable[[], Partitions],
        grace_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._consumer = consumer  # a getter: faust's consumer exists once the app runs
        self.grace_s = grace_s
        self.clock = clock
        self.held: set[Hashable] = set()
        self.rounds = 0
        self._next: dict[Hashable, int] = {}  # the next offset of each partition seen
        self._idle: dict[Hashable, int] = {}  # unseen partitions not waited for, at highwater
        self._assigned: frozenset[Hashable] = frozenset()
        self._by_name: dict[tuple[str, int], Hashable] = {}
        self._waiting_since: float | None = None  # the agent waits for its next prompt
        self._closer: Hashable | None = None  # the partition whose turn ended the last round

    def wrap(self, handle: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
        """`handle(event)`, with each event counted as its partition's turn."""

        async def handle_in_turn(event: Any) -> None:
            self._waiting_since = None
            self.took(event.message.tp, event.message.offset)
            try:
                await handle(event)
            finally:
                self._waiting_since = self.clock()

        return handle_in_turn

    def took(self, message_tp: Any, offset: int) -> None:
        """A prompt of `message_tp` was taken: its turn this round; the round ends when no partition
        not held has prompts waiting."""
        consumer = self._consumer()
        assigned = frozenset(consumer.assignment())
        if assigned != self._assigned:  # a rebalance: what was known of the others is stale
            self._assigned = assigned
            self._by_name = {(t.topic, t.partition): t for t in assigned}
            self._next.clear()
            self._idle.clear()
            self.held &= assigned
        # the consumer's own partition object: a message's is aiokafka's, which faust's active
        # set must not hold (it asserts faust's TP)
        name = (message_tp.topic, message_tp.partition)
        tp: Hashable = self._by_name.get(name, message_tp)
        self._next[tp] = offset + 1
        if tp == self._closer:
            return  # the rest of the batch whose first prompt ended the last round: that turn
        self._closer = None
        if tp in assigned:
            # again for a partition held already: faust may have released it (buffer drained)
            self.held.add(tp)
            consumer.on_buffer_full(tp)
        if not any(self._waits(consumer, other) for other in assigned - self.held):
            self._next_round(consumer)
            self._closer = tp

    def _waits(self, consumer: Partitions, tp: Hashable) -> bool:
        # `tp` is in the assignment read just before, in this same step (no await between):
        # aiokafka answers `highwater` only for an assigned partition
        highwater = consumer.highwater(tp)
        if tp in self._next:
            return highwater is not None and highwater > self._next[tp]
        if tp in self._idle:
            return highwater is not None and highwater > self._idle[tp]
        return True  # not seen yet: it may have a backlog (until the grace says otherwise)

    def _next_round(self, consumer: Partitions) -> None:
        self.rounds += 1
        held, self.held = self.held, set()
        # only what is still assigned: faust would make a revoked partition active again
        for tp in held & set(consumer.assignment()):
            consumer.on_buffer_drop(tp)

    def idle_check(self) -> None:
        """After `grace_s` with no prompt while partitions are held, the partitions that have
        not delivered are not waited for (until their highwater grows): the round ends."""
        if not self.held or self._waiting_since is None:
            return
        if self.clock() - self._waiting_since < self.grace_s:
            return
        consumer = self._consumer()
        # aiokafka answers `highwater` only for an assigned partition: one revoked since the
        # last event is skipped (the next event tells of the new assignment)
        assigned = set(consumer.assignment())
        for tp in self._assigned - self.held:
            if tp not in self._next and tp in assigned:
                self._idle[tp] = consumer.highwater(tp) or 0
        self._next_round(consumer)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.grace_s / 4)
            self.idle_check()
