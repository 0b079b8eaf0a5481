"""Leases: one per partition assignment, the one thing acks, ownership and commits go by.

A worker takes a lease on a partition at the first event delivered after the partition was
(re)assigned to it, and the lease ends when the partition is revoked. The lease knows where the
partition must resume (the group's committed offset, asked once) and admits only the offsets
that follow it, in order, without a hole; acks go through it in offset order; and the commit
guard (`Checkpoint`, in faust's consumer thread) commits a partition no further than
its lease's acked run. So the invariant (streams/core/checkpoint.py, the protocol's steps) is
checked where the commit is made, not left to timing.

What it refuses, and why (each was a way to lose a prompt with faust-streaming 0.15.3):
- An event delivered under an earlier lease (the agent held it, waiting for a slot, across a
  rebalance): STALE, dropped unacked. Acked, it would land in faust's acked list for the
  partition, which faust keeps across the reassignment and commits from, past offsets whose
  only copy died with the revocation.
- A first offset past the group's committed one, or a hole later on (a record the fetcher did
  not hand over): GAP, dropped unacked, and the partition is sought back to the missing offset,
  which is then delivered again (records fetched before the seek still arrive: refused too).
  faust commits the first run of consecutive acked offsets, and does not see a hole at a
  committed offset of 0 or of one offset (faust-streaming #606). Only Kafka can say that a
  hole is in the log itself (a transaction marker, records deleted by retention): a hole that
  stays `HOLE_CHECK_S` after the seek is looked up in the log (`first_at`); if the log has no
  record there, the lease admits over it, with an error line; if it has, it seeks again.
- An offset the lease admitted already (delivered again after such a seek): DUPLICATE.

Everything here runs in the worker's event loop but `committable`, which faust's consumer thread
calls: it only reads (a dict lookup and an int), so it needs no lock.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

# where a partition resumes: the group's committed offset, or the log's start when it has none
# and reads from the earliest; None: where the consumer was put (no commit, reading from the
# latest: the first offset delivered is the start)
StartOf = Callable[[Hashable], Awaitable[int | None]]
Seek = Callable[[Hashable, int], Awaitable[None]]

# the first offset the log holds at or after an offset (None: none yet)
FirstAt = Callable[[Hashable, int], Awaitable[int | None]]

# seconds a hole may stay after the seek back to it before the log is asked whether it has a
# record there (and again as often, while it stays)
HOLE_CHECK_S = 5.0


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
    start: int | None = None  # the group's committed offset when the lease began
    next: int | None = None  # the next offset to admit
    acked: int | None = None  # every offset below it is acked: its outcome durable
    seeks: int = 0  # seeks back to `next`
    checked_at: float = 0.0  # when the hole at `next` was last sought back to or looked up
    # holes in the log admitted over (start of hole -> the offset after it)
    holes: dict[int, int] = field(default_factory=dict)


class Leases:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._current: dict[Hashable, Lease] = {}
        self._start_of: StartOf | None = None
        self._seek: Seek | None = None
        self._first_at: FirstAt | None = None
        self._clock = clock

    def connect(self, start_of: StartOf, seek: Seek, first_at: FirstAt | None = None) -> None:
        """The consumer's side: the group's committed offsets, a seek, and a look into the log
        (without it a hole is never admitted over). Unconnected (unit tests of other parts), a
        lease starts at its first offset, unchecked."""
        self._start_of, self._seek, self._first_at = start_of, seek, first_at

    def lease(self, tp: Hashable) -> Lease:
        """The partition's current lease, begun now if it has none: call as an event is
        delivered, before any wait, so the event is judged by the lease it came under."""
        lease = self._current.get(tp)
        if lease is None:
            lease = self._current[tp] = Lease(tp)
        return lease

    def holds(self, lease: Lease) -> bool:
        return self._current.get(lease.tp) is lease

    def revoke(self, partitions: Iterable[Hashable]) -> list[Lease]:
        ended = []
        for tp in partitions:
            lease = self._current.pop(tp, None)
            if lease is not None:
                ended.append(lease)
        return ended

    def held(self) -> list[Hashable]:
        """Partitions with a lease."""
        return list(self._current)

    def not_in(self, assigned: Iterable[Hashable]) -> list[Hashable]:
        """Partitions with a lease outside this assignment: a lease begun between a revocation
        and the assignment that did not give the partition back (to be revoked: `revoke`)."""
        kept = set(assigned)
        return [tp for tp in self._current if tp not in kept]

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
        if offset > lease.next and not await self._over_a_hole(lease, offset):
            return Verdict.GAP
        lease.next = offset + 1
        lease.seeks = 0
        return Verdict.ADMIT

    async def _over_a_hole(self, lease: Lease, offset: int) -> bool:
        """`offset` came where `lease.next` was due: seek back to it (once; again when the log
        has it but it still does not come), or admit over it when the log has no record there.
        True: admit `offset`."""
        assert lease.next is not None
        due, now = lease.next, self._clock()
        if lease.seeks == 0:
            log.warning(
                "partition %s: offset %d delivered where %d was due (%s); seeking back to %d",
                _name(lease.tp),
                offset,
                due,
                "the group's committed offset" if due == lease.start else "a hole",
                due,
            )
            await self._seek_to(lease, now)
            return False
        if self._first_at is None or now - lease.checked_at < HOLE_CHECK_S:
            return False  # fetched before the seek took effect, or not looked up yet
        lease.checked_at = now
        first = await self._first_at(lease.tp, due)
        if not self.holds(lease) or first is None or first <= due:
            if first == due:
                await self._seek_to(lease, now)  # the log has it: ask for it again
            return False
        if first > offset:
            return False  # the log skips past this offset too: it will not come again
        log.error(
            "partition %s: offsets %d to %d are not in the log (a transaction marker, or "
            "deleted by retention); going on from %d",
            _name(lease.tp),
            due,
            first - 1,
            first,
        )
        lease.holes[due] = first
        if lease.acked == due:
            lease.acked = first
        if first < offset:
            lease.next = first  # due now: sought back to it
            await self._seek_to(lease, now)
            return False
        return True

    async def _seek_to(self, lease: Lease, now: float) -> None:
        lease.seeks += 1
        lease.checked_at = now
        if self._seek is not None:
            assert lease.next is not None
            await self._seek(lease.tp, lease.next)

    def acked(self, lease: Lease, offset: int) -> None:
        """Record that `offset`'s outcome is durable and its event acked: the lease's acked run
        grows by one. Raises LeaseError for an ack out of order or of an ended lease."""
        if not self.holds(lease):
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


def _name(tp: Hashable) -> str:
    topic, partition = getattr(tp, "topic", None), getattr(tp, "partition", None)
    return f"{topic}/{partition}" if topic is not None else str(tp)
