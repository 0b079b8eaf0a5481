"""The commit protocol's last step (streams/core/checkpoint.py): each partition committed no
further than its lease's acked run, a lowered commit said as an error, and a commit of
partitions a rebalance took skipped."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from faust.types import TP

from streams.core.checkpoint import Checkpoint
from tests.streams.core.test_leases import P0, connected

P1 = TP("prompts", 1)


def test_a_commit_past_the_acked_run_is_lowered_and_said(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> dict[Any, int]:
        leases, _ = connected(committed=0)
        lease = leases.lease(P0)
        for offset in range(3):
            await leases.admit(lease, offset)
        leases.acked(lease, 0)
        # partition 1 has no lease: left out
        return Checkpoint(leases).offsets({P0: 3, P1: 8}, assigned={P0, P1})

    with caplog.at_level(logging.ERROR):
        assert asyncio.run(scenario()) == {P0: 1}
    assert any("lowered from 3 to 1" in r.getMessage() for r in caplog.records)


def test_partitions_a_rebalance_took_are_not_committed(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        assert Checkpoint().offsets({P0: 5}, assigned={P1}) == {}
    assert any("skipped after a rebalance" in r.getMessage() for r in caplog.records)
    # one partition still ours: the commit goes on (faust filters the rest)
    assert Checkpoint().offsets({P0: 5, P1: 2}, assigned={P1}) == {P0: 5, P1: 2}
