"""Acks leave the in-flight window only in offset order (the faust #606 hazard), per lease."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.generate.inflight import InFlightWindow


def test_fast_later_offsets_wait_for_a_slow_head() -> None:
    window: InFlightWindow[str, int] = InFlightWindow()
    for offset in range(5):
        window.add("p0", offset, offset * 10)
    assert window.finish("p0", 3) == []
    assert window.finish("p0", 1) == []
    assert window.finish("p0", 0) == [(0, 0), (1, 10)]
    assert window.finish("p0", 2) == [(2, 20), (3, 30)]
    assert window.oldest("p0") == 4


def test_partitions_are_independent_and_revocation_forgets() -> None:
    window: InFlightWindow[str, str] = InFlightWindow()
    window.add("a", 10, "a10")
    window.add("b", 5, "b5")
    assert window.finish("b", 5) == [(5, "b5")]
    assert window.forget(["a"]) == ["a10"]  # still in flight: its copy may be claimed
    assert window.finish("a", 10) == []  # the new owner redoes it
    assert len(window) == 0


@given(st.permutations(list(range(30))))
def test_any_completion_order_acks_each_offset_once_in_order(order: list[int]) -> None:
    window: InFlightWindow[int, int] = InFlightWindow()
    for offset in range(30):
        window.add(0, offset, offset)
    acked: list[int] = []
    for offset in order:
        released = [item for _, item in window.finish(0, offset)]
        # nothing is released while a lower offset is still in flight
        assert all(o <= max(order[: order.index(offset) + 1]) for o in released)
        acked += released
        if acked:
            assert set(range(acked[-1] + 1)) <= set(order[: order.index(offset) + 1])
    assert acked == list(range(30))


def test_an_offset_is_added_once_and_in_order() -> None:
    window: InFlightWindow[str, int] = InFlightWindow()
    window.add("lease", 4, 4)
    for offset in (4, 3):
        with pytest.raises(ValueError, match="out of order"):
            window.add("lease", offset, offset)
    window.add("another lease", 4, 4)  # a new lease of the partition: its own entries
    assert window.finish("lease", 4) == [(4, 4)]
    assert window.holds("another lease", 4)
