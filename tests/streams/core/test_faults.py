"""The crash points: inert in production, and the tests' arming (tests/faults.py) ends the
process at the N-th pass through the armed point only."""

from __future__ import annotations

import pytest

from streams.core import faults
from streams.core.faults import AFTER_DEAD_LETTERS, AFTER_MARKER, crash_point
from tests.faults import KILLED, Crash, arm_from_environment, armed


def test_a_crash_point_does_nothing_unless_armed() -> None:
    assert faults.armed is None
    crash_point(AFTER_MARKER)  # returns


def test_the_nth_pass_through_the_armed_point_exits() -> None:
    exits: list[int] = []
    with armed({AFTER_MARKER: 2}, exits.append):
        crash_point(AFTER_DEAD_LETTERS)
        crash_point(AFTER_MARKER)
        assert exits == []
        crash_point(AFTER_MARKER)
        assert exits == [KILLED]
        crash_point(AFTER_MARKER)  # fired once
        assert exits == [KILLED]
    assert faults.armed is None


def test_a_worker_is_armed_from_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in Crash(AFTER_DEAD_LETTERS, 1).env().items():
        monkeypatch.setenv(name, value)
    arm_from_environment()
    try:
        assert faults.armed is not None
    finally:
        faults.armed = None
