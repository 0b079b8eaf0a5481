"""Typed fakes shared by the unit tests: a consumed record as the stages see it (faust's Event:
`message.tp`, `message.offset`, `key`, `value`, `ack()`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TP:
    """A topic partition (faust's TP and aiokafka's TopicPartition have these two fields)."""

    topic: str
    partition: int


@dataclass(frozen=True)
class Message:
    tp: TP
    offset: int


@dataclass
class FakeEvent:
    """A faust Event; `ack` runs `on_ack` (a check, or a journal of its own), counts itself and
    appends ``("ack", partition, offset)`` to `log`."""

    message: Message
    value: bytes
    log: list[tuple[Any, ...]] = field(default_factory=list)
    key: bytes | None = None
    on_ack: Callable[[FakeEvent], None] | None = None
    acked: int = 0

    def ack(self) -> bool:
        if self.on_ack is not None:
            self.on_ack(self)
        self.acked += 1
        self.log.append(("ack", self.message.tp.partition, self.message.offset))
        return True
