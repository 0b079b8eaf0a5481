"""Leases: one per partition assignment, the one thing acks, ownership and commits go by.

A worker takes a lease on a partition at the first event delivered after the partition was
(re)assigned to it, and the lease ends when the partition is revoked. The lease knows where the
partition must resume (the group's committed offset, asked once) and admits only the offsets
that follow it, in order, without a hole; acks go through it in offset order; and the commit
guard (streams/core/faust_app.py, in faust's consumer thread) commits a partition no further than
its lease's acked run. So the invariant is checked where the commit is made, not left to timing:

    an offset is committed only after its own outcome and every outcome below it are durable.

What it refuses, and why (each was a way to lose a prompt with faust-streaming 0.15.3):
- An event delivered under an earlier lease (the agent held it, waiting for a slot, across a
  rebalance): STALE, dropped unacked. Acked, it would land in faust's acked list for the
  partition, which faust keeps across the reassignment and commits from, past offsets whose
  only copy died with the revocation.
- A first offset past the group's committed one, or a hole later on (a record the fetcher did
  not hand over): GAP, dropped unacked, and the partition is sought back to the missing offset,
  which is then delivered again. faust commits the first run of consecutive acked offsets, and
  does not see a hole at a committed offset of 0 or of one offset (faust-streaming #606).
- An offset the lease admitted already (delivered again after such a seek): DUPLICATE.

Everything here runs in the worker's event loop but `committable`, which faust's consumer thread
calls: it only reads (a dict lookup and an int), so it needs no lock.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

# where a partition resumes: the group's committed offset, or the log's start when it has none
# and reads from the earliest; None: where the consumer was put (no commit, reading from the
# latest: the first offset delivered is the start)
StartOf = Callable[[Hashable], Awaitable[int | None]]
Seek = Callable[[Hashable, int], Awaitable[None]]

# a hole that stays after this many seeks back to it is taken to be one in the log itself
# (a transaction marker, records deleted by retention): admitted over, with an error line
SEEKS_BEFORE_A_HOLE = 3


class Verdict(enum.Enum):
    ADMIT = "admit"
    STALE = "stale"  # delivered under an earlier lease: the partition was revoked since
    DUPLICATE = "duplicate"  # admitted already in this lease
    GAP = "gap"  # past the next offset: a record was not delivered; sought back to it


class LeaseError(RuntimeError):
    """An ack out of offset order, or of a lease that ended: a bug, never bad input."""


@dataclass(eq=False)  # identity: two leases of one partition are never the same lease
class Lease:
    tp: Hashable
    number: int  # this worker's count of leases on the partition
    start: int | None = None  # the group's committed offset when the lease began
    next: int | None = None  # the next offset to admit
    acked: int | None = None  # every offset below it is acked: its outcome durable
    ended: bool = False
    seeks: int = 0  # seeks back to `next`
    # holes in the log admitted over (start of hole -> the offset after it)
    holes: dict[int, int] = field(default_factory=dict)


class Leases:
    def __init__(self) -> None:
        self._current: dict[Hashable, Lease] = {}
        self._numbers: dict[Hashable, int] = {}
        self._start_of: StartOf | None = None
        self._seek: Seek | None = None

    def connect(self, start_of: StartOf, seek: Seek) -> None:
        """The consumer's side: the group's committed offsets and a seek. Unconnected (unit
        tests of other parts), a lease starts at its first offset, unchecked."""
        self._start_of, self._seek = start_of, seek

    def lease(self, tp: Hashable) -> Lease:
        """The partition's current lease, begun now if it has none: call as an event is
        delivered, before any wait, so the event is judged by the lease it came under."""
        lease = self._current.get(tp)
        if lease is None:
            number = self._numbers.get(tp, 0) + 1
            self._numbers[tp] = number
            lease = self._current[tp] = Lease(tp, number)
        return lease

    def holds(self, lease: Lease) -> bool:
        return self._current.get(lease.tp) is lease

    def revoke(self, partitions: Iterable[Hashable]) -> list[Lease]:
        ended = []
        for tp in partitions:
            lease = self._current.pop(tp, None)
            if lease is not None:
                lease.ended = True
                ended.append(lease)
        return ended

    async def admit(self, lease: Lease, offset: int) -> Verdict:
        if not self.holds(lease):
            return Verdict.STALE
        if lease.start is None:
            start = None if self._start_of is None else await self._start_of(lease.tp)
            if not self.holds(lease):
                return Verdict.STALE  # revoked while the group was asked
            if lease.start is None:
                lease.start = lease.next = lease.acked = offset if start is None else start
        assert lease.next is not None
        if offset < lease.next:
            return Verdict.DUPLICATE
        if offset > lease.next:
            if lease.seeks < SEEKS_BEFORE_A_HOLE or self._seek is None:
                await self._seek_back(lease, offset)
                return Verdict.GAP
            log.error(
                "partition %s: offsets %d to %d are not in the log after %d seeks back; "
                "taking them as a hole in the log (none of them is a prompt this worker saw)",
                _name(lease.tp),
                lease.next,
                offset - 1,
                lease.seeks,
            )
            lease.holes[lease.next] = offset
            if lease.acked == lease.next:
                lease.acked = offset
        lease.next = offset + 1
        lease.seeks = 0
        return Verdict.ADMIT

    async def _seek_back(self, lease: Lease, offset: int) -> None:
        lease.seeks += 1
        if lease.seeks == 1:  # once per hole: later events of the same hole say nothing new
            log.warning(
                "partition %s: offset %d delivered where %d was due (%s); seeking back to %d",
                _name(lease.tp),
                offset,
                lease.next,
                "the group's committed offset" if lease.next == lease.start else "a hole",
                lease.next,
            )
        if self._seek is not None:
            assert lease.next is not None
            await self._seek(lease.tp, lease.next)

    def acked(self, lease: Lease, offset: int) -> None:
        """Record that `offset`'s outcome is durable and its event acked: the lease's acked run
        grows by one. Raises LeaseError for an ack out of order or of an ended lease."""
        if lease.ended or not self.holds(lease):
            raise LeaseError(
                f"partition {_name(lease.tp)}: ack of offset {offset} after revocation"
            )
        if offset != lease.acked:
            raise LeaseError(
                f"partition {_name(lease.tp)}: ack of offset {offset} where {lease.acked} is due"
            )
        acked = offset + 1
        lease.acked = lease.holes.pop(acked, acked)

    def committable(self, tp: Hashable, offset: int) -> int | None:
        """How far the partition may be committed when faust wants `offset`: no further than
        its lease's acked run; None: not at all (no lease, or nothing acked under it yet)."""
        lease = self._current.get(tp)
        if lease is None or lease.acked is None or lease.acked == lease.start:
            return None
        return min(offset, lease.acked)

    def in_flight(self) -> dict[Hashable, Lease]:
        return dict(self._current)


def _name(tp: Hashable) -> str:
    topic, partition = getattr(tp, "topic", None), getattr(tp, "partition", None)
    return f"{topic}/{partition}" if topic is not None else str(tp)
