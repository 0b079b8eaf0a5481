"""The request-log figures of issue 38's scenarios (tests/work_analysis.py), on tiny logs whose
answers are worked out by hand."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest

from tests.work_analysis import (
    Outage,
    Request,
    best_possible_s,
    idle_slot_seconds,
    overlaps,
    read_request_log,
    redone_generations,
    requested_more_than_once,
    work_figures,
)


def r(prompt: str, server: str, start: float, end: float, outcome: str = "ok") -> Request:
    return Request(prompt, server, start, end, outcome)


def test_a_log_line_names_its_prompt_by_digest_and_probes_are_counted_apart(
    tmp_path: Path,
) -> None:
    log = tmp_path / "requests-a.jsonl"
    lines = [
        {"prompt": "d1", "path": "/v1/chat/completions", "start": 1.0, "end": 2.5, "outcome": "ok"},
        {"prompt": "probe", "path": "/generate", "start": 0.5, "end": 0.6, "outcome": "ok"},
        {
            "prompt": "d2",
            "path": "/v1/chat/completions",
            "start": 2.0,
            "end": 3.0,
            "outcome": "cut",
        },
    ]
    log.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    requests, unknown = read_request_log(log, "a", {"d1": "p1", "d2": "p2"})
    assert requests == [r("p1", "a", 1.0, 2.5), r("p2", "a", 2.0, 3.0, "cut")]
    assert unknown == 1
    assert read_request_log(tmp_path / "absent.jsonl", "b", {}) == ([], 0)


def test_overlaps_are_one_prompt_on_two_servers_at_once() -> None:
    requests = [
        r("p1", "a", 0, 10),
        r("p1", "b", 8, 9),  # while a still runs it: an overlap
        r("p2", "a", 0, 2, "http_503"),
        r("p2", "a", 2, 4),  # a retry on the same server: redone, not an overlap
        r("p3", "a", 0, 3, "reset"),
        r("p3", "b", 3, 5),  # after the first ended: not an overlap
    ]
    found = overlaps(requests)
    assert [(o.first.server, o.second.server, o.seconds) for o in found] == [("a", "b", 1)]
    assert "p1: on a" in str(found[0])
    assert overlaps(requests, excused=lambda o: o.first.server == "a") == []
    assert requested_more_than_once(requests) == {"p1": 2, "p2": 2, "p3": 2}
    assert redone_generations(requests) == 1  # p1's second whole answer


def test_idle_slots_count_a_free_healthy_slot_while_a_prompt_waits() -> None:
    published = dict.fromkeys(("p1", "p2", "p3"), 0.0)
    requests = [r("p1", "a", 0, 10), r("p2", "b", 0, 2), r("p3", "b", 5, 7)]
    # b is free from 2 to 5 while p3 waits: 3 slot-seconds
    assert idle_slot_seconds(requests, published, ["a", "b"], slots=1) == pytest.approx(3)
    # two slots each: b's second slot is free while p3 waits from 0 to 5
    assert idle_slot_seconds(requests, published, ["a", "b"], slots=2) == pytest.approx(5)
    # b down from 2 to 5: no healthy slot was free
    down = [Outage("b", 2, 5)]
    assert idle_slot_seconds(requests, published, ["a", "b"], 1, down) == pytest.approx(0)
    # a prompt never served waits until the end given: b is free again from 7 to 10
    never = {**published, "p4": 1.0}
    assert idle_slot_seconds(requests, never, ["a", "b"], 1, end=10) == pytest.approx(3 + 3)


def test_best_possible_spreads_the_work_over_the_healthy_slots() -> None:
    requests = [r("p1", "a", 0, 4), r("p2", "b", 0, 1), r("p3", "a", 4, 6), r("p4", "a", 6, 9)]
    # 10 s of work on two slots: 5 s; none longer than that
    assert best_possible_s(requests, ["a", "b"], 1, start=0) == pytest.approx(5)
    # b dead from 1 s on: 2 slot-seconds until then, 8 left on a alone
    assert best_possible_s(requests, ["a", "b"], 1, 0, [Outage("b", 1)]) == pytest.approx(9)
    # the longest generation bounds it from below
    long = [*requests, r("p5", "b", 1, 21)]
    assert best_possible_s(long, ["a", "b"], 1, start=0) == pytest.approx(20)
    # a pause of the server is not work: 10 s less the 6 s it was stopped
    paused = [r("p1", "b", 0, 10)]
    assert best_possible_s(paused, ["a", "b"], 1, 0, [Outage("b", 2, 8)]) == pytest.approx(4)
    assert best_possible_s(paused, ["b"], 1, 0, [Outage("b", 0)]) == math.inf


def test_work_figures_of_a_run() -> None:
    published = dict.fromkeys(("p1", "p2"), 100.0)
    requests = [
        r("p1", "a", 100, 104),
        r("p2", "b", 100, 103, "reset"),
        r("p2", "a", 104, 106),
        r("other", "a", 100, 101),  # not one of the run's prompts
    ]
    figures = work_figures(requests, published, ["a", "b"], slots=1, outages=[Outage("b", 103)])
    assert figures.prompts == 2
    assert (figures.requested_more_than_once, figures.redone, figures.overlaps) == (1, 0, 0)
    assert figures.finish_s == pytest.approx(6)
    assert figures.best_s == pytest.approx(4)  # p1 4 s, p2 2 s; b dead at 103
    assert figures.idle_slot_s == pytest.approx(0)  # a was busy whenever p2 waited
    assert "finish 6.0s against best 4.0s" in figures.line()
