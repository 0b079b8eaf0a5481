"""FairTurns (streams/generate/fair.py) holds and releases partitions through faust's own buffer
hooks: this fails if the installed faust renames them, changes their signature, or no longer
uses them to hold a partition's records."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

from faust.transport import conductor
from faust.transport.consumer import Consumer

from streams.generate.fair import Partitions

HOOKS = ("on_buffer_full", "on_buffer_drop")


def test_faust_consumer_has_every_method_fair_turns_uses_with_its_signature() -> None:
    for name in ("assignment", "highwater", *HOOKS):
        assert name in vars(Partitions), name  # what FairTurns asks of the consumer
        theirs = inspect.signature(getattr(Consumer, name)).parameters
        ours = inspect.signature(getattr(Partitions, name)).parameters
        assert list(theirs) == list(ours), name


def test_faust_holds_a_partition_with_the_hooks_and_releases_it() -> None:
    active: set[str] = {"p0", "p1"}
    consumer = SimpleNamespace(
        app=SimpleNamespace(in_recovery=False),
        _get_active_partitions=lambda: active,
        _buffered_partitions=set(),
    )
    hold: Any = Consumer.on_buffer_full
    release: Any = Consumer.on_buffer_drop
    hold(consumer, "p0")
    assert active == {"p1"}  # no longer fetched from: held
    release(consumer, "p0")
    assert active == {"p0", "p1"}  # released


def test_faust_itself_holds_full_stream_buffers_with_the_same_hooks() -> None:
    source = inspect.getsource(conductor)
    for name in HOOKS:
        assert f"app.consumer.{name}" in source, name
