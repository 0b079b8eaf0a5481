"""A generate worker is a static group member by default (streams/core/membership.py): a
restart takes its old place without a rebalance, and that keeps every prompt's one outcome.

Two workers serve one server URL on this host, so they hold slots 0 and 1: two identities,
both in the group. One is killed -9 with requests in flight and restarted at once. It claims
its slot again, so it rejoins under its old identity and gets its old partitions back in the
group's current generation: the survivor sees no rebalance. No revocation ran for the killed
process, so what the restarted one resumes from is the group's committed offsets (its leases
ask Kafka, streams/core/leases.py): every prompt must still end with exactly one outcome.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from streams.core.settings import GENERATE_GROUP
from tests.integration.probes import emulator_stats, log_lines, log_size, stable_members
from tests.polling import wait_for

pytestmark = pytest.mark.integration

MEMBER = r"static member (\S+) of group"
GENERATION = r"generation id (\d+) app consumers id"
CONCURRENCY = 8


def _member(process: object) -> str:
    lines = log_lines(process, MEMBER)  # type: ignore[arg-type]
    found = re.search(MEMBER, lines[-1])
    assert found is not None
    return found.group(1)


def _generations(process: object, since: int = 0) -> list[int]:
    lines = log_lines(process, GENERATION, since)  # type: ignore[arg-type]
    return [int(m.group(1)) for line in lines if (m := re.search(GENERATION, line))]


def test_a_static_worker_killed_with_requests_in_flight_is_back_without_a_rebalance(
    pipeline, write_prompts
) -> None:
    pipeline.partitions = 4
    url, _ = pipeline.emulator("--tokens-per-s", "300")
    # a session long enough that the restart is back within it, even on a loaded machine
    env = {"DRAFTGEN_KAFKA_SESSION_TIMEOUT_S": "30"}
    flags = ("--concurrency", str(CONCURRENCY))
    victim = pipeline.generate(url, *flags, name="g1", env=env)
    survivor = pipeline.generate(url, *flags, name="g2", env=env)
    tokenize = pipeline.tokenize()
    summary = pipeline.publish(write_prompts(400))
    expected = set(summary.prompt_ids)

    wait_for(
        lambda: asyncio.run(stable_members(pipeline.kafka, GENERATE_GROUP)) == 2,
        120,
        "both workers in the group",
    )
    identity = _member(victim)
    assert identity != _member(survivor), "two workers of one server, one identity each"
    # more requests running than one worker's concurrency: the victim has some in flight
    wait_for(
        lambda: emulator_stats(url)["running"] > CONCURRENCY,
        120,
        "both workers' requests in flight",
        interval=0.1,
    )
    settled = _generations(survivor)[-1]
    mark = log_size(survivor)
    restarted_from = log_size(victim)
    victim.kill()  # type: ignore[attr-defined]
    restarted = pipeline.stack.restart(victim)

    wait_for(
        lambda: _generations(restarted, restarted_from),
        120,
        "the restarted worker's assignment",
    )
    assert _member(restarted) == identity, "the restart claims its slot, so its identity, again"
    assert _generations(restarted, restarted_from) == [settled], "back in the same generation"
    pipeline.wait(expected, [restarted, survivor, tokenize])
    assert _generations(survivor, mark) == [], "the survivor saw no rebalance"
    pipeline.assert_exactly_once(expected)
