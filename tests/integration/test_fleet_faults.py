"""Issue 48, "a fleet fails in parts: each part costs only itself", in CI: three emulated
servers, one generate worker each, and one partial failure (tests/benchmarks/fleet_faults.py
runs them large):

- a node that answers 404 to everything (a wrong served model name, its health checks pass):
  no prompt is dead-lettered for it, its worker says so in one line, and every prompt is a
  completion from the others;
- a prompt that crashes any server it reaches, every server under a restart policy: it ends as
  a `server_crash` dead letter naming two servers after two crashes, each prompt that ran
  beside it is requested at most once more, and the run finishes;
- one worker's wall clock 30 s ahead and one 30 s behind (libfaketime; Debian's faketime,
  installed by `compose/setup.sh test`): no prompt is requested twice, none runs on two
  servers at once.
"""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from streams.generate import blame
from tests.benchmarks.fleet_faults import (
    bomb_id,
    crashing_prompt,
    plans,
    refusing_node,
    skewed_clocks,
)
from tests.integration.test_work_distribution import assert_sealed_once, run

pytestmark = pytest.mark.integration

SERVERS, PROMPTS = 3, 120


def test_a_node_that_refuses_everything_dead_letters_nothing(pipeline, tmp_path: Path) -> None:
    plan = plans(SERVERS, PROMPTS)["refusing"]
    result, tokenize = run(pipeline, tmp_path, plan, refusing_node)
    report, measures = result.report(), result.measures
    assert measures["finished_s"] is not None, report
    assert not result.lost, report
    assert measures["mistaken_dead_letters"] == 0, report
    # it took its first prompts (a slot each) before any answer came back, then closed its gate
    assert measures["requests_to_refusing_node"] <= 2 * result.plan.concurrency, report
    assert measures["refusing_shown_after_s"] is not None, f"no refusing line\n{report}"
    assert measures["refusing_shown_after_s"] < 30, report
    assert_sealed_once(pipeline, result, tokenize)


def test_a_prompt_that_crashes_servers_becomes_a_dead_letter_and_the_run_finishes(
    pipeline, tmp_path: Path
) -> None:
    plan = replace(plans(SERVERS, PROMPTS)["crash"], concurrency=8)
    result, tokenize = run(pipeline, tmp_path, plan, crashing_prompt)
    report, measures = result.report(), result.measures
    assert measures["finished_s"] is not None, report
    assert not result.lost, report
    assert measures["bomb"].startswith(f"{blame.SERVER_CRASH}:"), report
    assert measures["crashes"] == blame.CRASHES, report
    assert measures["bomb_requests"] == blame.CRASHES, report
    assert measures["mistaken_dead_letters"] == 0, report
    # each prompt beside it ran once more at most: suspects run one at a time
    assert measures["most_requests_of_an_innocent"] <= 2, report
    assert_sealed_once(pipeline, result, tokenize)
    assert bomb_id() in result.audit.where


def faketime_library() -> str:
    done = subprocess.run(
        ["bash", str(Path(__file__).parents[2] / "compose/ensure_faketime.sh")],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() if done.returncode == 0 else ""


def test_workers_30_s_apart_in_clock_request_no_prompt_twice(pipeline, tmp_path: Path) -> None:
    lib = faketime_library()
    if not lib:
        pytest.skip("no libfaketime here, and it cannot be installed (compose/ensure_faketime.sh)")
    plan = replace(plans(SERVERS, 90, faketime=lib)["skew"], concurrency=8)
    result, tokenize = run(pipeline, tmp_path, plan, skewed_clocks)
    report = result.report()
    assert result.measures["finished_s"] is not None, report
    assert not result.lost, report
    assert not result.overlaps, f"a prompt running on two servers at once\n{report}"
    assert result.figures.requested_more_than_once == 0, report
    assert_sealed_once(pipeline, result, tokenize)
