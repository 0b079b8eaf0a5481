"""Offsets in flight per lease, released for acking only in offset order.

Faust commits the first contiguous run of *acked* offsets, even when a lower offset is still in
flight (faust-streaming #606): with many requests in flight that loses messages on restart. We
ack a message only once every lower offset of its lease is done, so the acked run always starts
at the committed offset and the commit can never pass a message still in flight. Entries are
keyed by lease (streams/core/leases.py: one per partition assignment), not by partition: a
revoked copy of an offset that ends late finds its lease gone and releases nothing, whatever
copy of the same offset a later lease holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
E = TypeVar("E")


@dataclass
class _Entry(Generic[E]):
    item: E
    done: bool = False


class InFlightWindow(Generic[K, E]):
    def __init__(self) -> None:
        # key (a lease) -> offset -> entry; offsets arrive in order within a key
        self._pending: dict[K, OrderedDict[int, _Entry[E]]] = {}

    def add(self, key: K, offset: int, item: E) -> None:
        pending = self._pending.setdefault(key, OrderedDict())
        if offset in pending or (pending and offset < next(reversed(pending))):
            raise ValueError(f"offset {offset} added out of order")  # the lease admits in order
        pending[offset] = _Entry(item)

    def finish(self, key: K, offset: int) -> list[tuple[int, E]]:
        """Mark one offset done; return the (offset, item) pairs now releasable, lowest first."""
        pending = self._pending.get(key)
        if pending is None or offset not in pending:
            return []  # the lease ended meanwhile: the partition's new owner redoes the work
        pending[offset].done = True
        released: list[tuple[int, E]] = []
        while pending:
            head, entry = next(iter(pending.items()))
            if not entry.done:
                break
            pending.popitem(last=False)
            released.append((head, entry.item))
        return released

    def holds(self, key: K, offset: int) -> bool:
        """Whether this offset is still in flight under this key."""
        return offset in self._pending.get(key, {})

    def forget(self, keys: Iterable[K]) -> list[E]:
        """Drop ended leases; returns the items dropped that were not done yet."""
        dropped: list[E] = []
        for key in keys:
            dropped.extend(e.item for e in self._pending.pop(key, {}).values() if not e.done)
        return dropped

    def __len__(self) -> int:
        return sum(len(p) for p in self._pending.values())

    def oldest(self, key: K) -> int | None:
        pending = self._pending.get(key)
        return next(iter(pending)) if pending else None
