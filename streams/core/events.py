"""The consumed record as the stages and the shard sink take it, without faust: a faust Event
satisfies it, and the unit tests pass their own (tests/fakes.py)."""

from __future__ import annotations

from typing import Any, Protocol


class Event(Protocol):
    """What the worker needs of a consumed message (a faust Event satisfies it)."""

    @property
    def key(self) -> Any: ...
    @property
    def value(self) -> Any: ...
    @property
    def message(self) -> Any: ...  # .tp, .offset

    def ack(self) -> bool: ...
