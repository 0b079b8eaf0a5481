"""Offsets in flight per partition, released for acking only in offset order.

Faust commits the first contiguous run of *acked* offsets, even when a lower offset is still in
flight (faust-streaming #606): with many requests in flight that loses messages on restart. We
ack a message only once every lower offset of its partition is done, so the acked run always
starts at the committed offset and the commit can never pass a message still in flight.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

E = TypeVar("E")


@dataclass
class _Entry(Generic[E]):
    item: E
    done: bool = False


class InFlightWindow(Generic[E]):
    def __init__(self) -> None:
        # partition -> offset -> entry; offsets arrive in order within a partition
        self._pending: dict[Hashable, OrderedDict[int, _Entry[E]]] = {}

    def add(self, partition: Hashable, offset: int, item: E) -> None:
        self._pending.setdefault(partition, OrderedDict())[offset] = _Entry(item)

    def finish(self, partition: Hashable, offset: int) -> list[E]:
        """Mark one offset done; return the items now releasable, lowest offset first."""
        pending = self._pending.get(partition)
        if pending is None or offset not in pending:
            return []  # the partition was revoked meanwhile: its new owner redoes the work
        pending[offset].done = True
        released: list[E] = []
        while pending:
            entry = next(iter(pending.values()))
            if not entry.done:
                break
            pending.popitem(last=False)
            released.append(entry.item)
        return released

    def holds(self, partition: Hashable, offset: int) -> bool:
        """Whether this offset is still ours (its partition not revoked since it was added)."""
        return offset in self._pending.get(partition, {})

    def forget(self, partitions: Iterable[Hashable]) -> int:
        """Drop revoked partitions; returns how many in-flight offsets were dropped."""
        dropped = 0
        for partition in partitions:
            dropped += len(self._pending.pop(partition, {}))
        return dropped

    def __len__(self) -> int:
        return sum(len(p) for p in self._pending.values())

    def oldest(self, partition: Hashable) -> int | None:
        pending = self._pending.get(partition)
        return next(iter(pending)) if pending else None
