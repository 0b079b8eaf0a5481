"""Horizontal scaling on the real stack: a generate worker added mid-run takes over partitions
and raises throughput; one stopped (SIGTERM) mid-run hands its partitions back; every prompt
ends exactly once either way."""

from __future__ import annotations

import asyncio
import re

import pytest

from compose.process import ManagedProcess
from streams.core.settings import GENERATE_GROUP
from tests.integration.probes import (
    key_counts,
    log_lines,
    requests_served,
    stable_members,
    topic_size,
)
from tests.polling import wait_for

pytestmark = pytest.mark.integration

PROMPTS = 240
# one stopped mid-run: each has served 30 or more when it stops, ~80 remain (80 fewer than
# with PROMPTS: ~11 s less of the survivor working alone)
STOPPED_PROMPTS = 160
# ~135 output tokens at 60 tokens/s: ~2.3 s a request, 16 in flight: ~7 prompts/s a server
SLOW = ("--tokens-per-s", "60")


def test_a_worker_added_mid_run_takes_partitions_and_raises_throughput(
    pipeline, write_prompts
) -> None:
    first_url, _ = pipeline.emulator(*SLOW, "--seed", "0", name="emulator-0")
    workers = [
        pipeline.generate(first_url, "--steal-after", "0", name="generate-0"),
        pipeline.tokenize(),
    ]
    # Published in two halves: the second after the new worker is in the group. How long a
    # join takes on a loaded machine varies (CI once saw the first worker finish nearly all of
    # one batch alone), so what the new worker gets must not depend on it.
    half = PROMPTS // 2
    expected = set(pipeline.publish(write_prompts(half, "first.jsonl")).prompt_ids)
    wait_for(lambda: topic_size(pipeline.kafka) >= 10, 60, "the first completions")

    second_url, _ = pipeline.emulator(*SLOW, "--seed", "1", name="emulator-1")
    # stealing off: what this test counts is what a rebalance redoes (a thief's duplicates
    # at the end of the run are counted by tests/benchmarks/bench_tail.py)
    workers.append(pipeline.generate(second_url, "--steal-after", "0", name="generate-1"))
    wait_for(lambda: members(pipeline) == 2, 90, "the new worker in the group")
    second = write_prompts(PROMPTS - half, "second.jsonl", start=half)
    expected |= set(pipeline.publish(second).prompt_ids)

    pipeline.wait(expected, workers, timeout=120)
    pipeline.assert_exactly_once(expected)
    # The throughput it adds is measured in tests/benchmarks/bench_scaling.py, not timed here:
    # on a loaded 2-core machine a rate over seconds is noise. What must hold is the takeover:
    # more than one in-flight window (16) of the second half, from the partitions it owns
    # (its first request is the probe for token ids, streams/generate/exact_ids.py).
    assert requests_served(second_url) - 1 > 16, "the new worker took over partitions"
    # Nothing was generated twice but the prompts in flight when a rebalance took their
    # partition (each worker logs how many; the new owner redoes them): the ledger and the
    # offsets held across the rebalance. Under load Faust may rebalance more than once.
    redone = sum(revoked_in_flight(worker) for worker in workers)
    served = requests_served(first_url) + requests_served(second_url) - 2  # the probes
    assert served <= PROMPTS + redone, (served, redone)
    # a healthy scale-out is no error: a user grepping the logs for ERROR finds nothing
    errors = [
        line
        for worker in workers
        for line in worker.log_path.read_text().splitlines()
        if "[ERROR]" in line
    ]
    assert errors == [], errors[:5]


def members(pipeline) -> int:
    """Members of the generate group, once it is Stable (0 while it rebalances)."""
    return asyncio.run(stable_members(pipeline.kafka, GENERATE_GROUP))


def revoked_in_flight(worker: ManagedProcess) -> int:
    """Prompts the worker had in flight when a rebalance revoked their partitions."""
    pattern = r"partitions revoked with (\d+) prompts in flight"
    found = (re.search(pattern, line) for line in log_lines(worker, pattern))
    return sum(int(match[1]) for match in found if match)


def test_a_worker_stopped_mid_run_hands_its_partitions_back(pipeline, write_prompts) -> None:
    urls, generators = [], []
    # static members whose session lasts the broker's shortest: the stopped one's partitions
    # move when it ends
    env = {"DRAFTGEN_KAFKA_SESSION_TIMEOUT_S": "6"}
    for index in range(2):
        url, _ = pipeline.emulator(*SLOW, "--seed", str(index), name=f"emulator-{index}")
        urls.append(url)
        generators.append(pipeline.generate(url, name=f"generate-{index}", env=env))
    tokenize = pipeline.tokenize()
    expected = set(pipeline.publish(write_prompts(STOPPED_PROMPTS)).prompt_ids)
    wait_for(lambda: requests_served(urls[1]) >= 30, 60, "both workers busy")
    wait_for(lambda: requests_served(urls[0]) >= 30, 60, "both workers busy")

    # SIGTERM: a static member (the default) sends no LeaveGroup, so its partitions move to the
    # other worker once its session times out
    generators[1].stop()
    stopped_at = requests_served(urls[1])
    remaining_at_stop = STOPPED_PROMPTS - topic_size(pipeline.kafka)
    before = requests_served(urls[0])
    assert remaining_at_stop > 32, "stopped mid-run: work left for the survivor to take over"

    try:
        pipeline.wait(expected, [generators[0], tokenize], timeout=90)
    except Exception:
        _explain_missing(pipeline, expected)
        raise
    pipeline.assert_exactly_once(expected)
    assert requests_served(urls[1]) == stopped_at, "a stopped worker sends nothing"
    # the survivor did all that remained, including the stopped worker's partitions
    assert requests_served(urls[0]) - before >= remaining_at_stop - 16


def _explain_missing(pipeline, expected: set[str]) -> None:
    """On a timeout: where the missing prompts got to (completions topic, ledger)."""
    from streams.core.ledger import CLAIM
    from streams.core.settings import GENERATED
    from streams.tools.progress import dataset_figures

    done = dataset_figures(pipeline.store()).prompt_ids
    completions = key_counts(pipeline.kafka)
    keys = key_counts(pipeline.kafka, GENERATED)
    ledger = {k.rpartition("@")[0] for k in keys if not k.endswith(CLAIM)}
    for prompt_id in sorted(expected - done):
        print(
            f"missing {prompt_id}: completions {completions.get(prompt_id, 0)}, "
            f"in ledger {prompt_id in ledger}"
        )
