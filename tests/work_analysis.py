"""How the work was spread over the servers, read from the emulated servers' request logs
(`--request-log`, compose/emulator/request_log.py): issue 38's figures for its scenarios
(tests/integration/test_work_distribution.py, tests/benchmarks/bench_work_distribution.py).

- redone: prompts requested more than once, and whole answers beyond a prompt's first;
- overlaps: one prompt running on two servers at the same time (the GPU does it twice);
- idle slot-seconds: a healthy server's free slot while a prompt waited that no server was
  running (what a dead or slow server must not cost the others);
- time to finish against the best possible: the total generation time spread over every healthy
  slot, never less than the longest single generation.

A request's line is written when it ends: a server killed -9 logs nothing of what it was running
(those requests simply did not happen here). A paused server's requests are logged when it
resumes, running across the pause; an `Outage` says when a server could not serve (its slots are
not counted free, its requests' time inside it is not counted as work).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson


@dataclass(frozen=True)
class Request:
    prompt: str  # the prompt's id
    server: str
    start: float  # wall clock (time.time()), as the emulator logs it
    end: float
    outcome: str  # ok, cut, reset, http_N, gone (compose/emulator/request_log.py)


@dataclass(frozen=True)
class Outage:
    """A server that cannot serve from `start` until `end` (killed: for ever)."""

    server: str
    start: float
    end: float = math.inf


@dataclass(frozen=True)
class Overlap:
    first: Request  # the one that started first
    second: Request

    @property
    def seconds(self) -> float:
        return min(self.first.end, self.second.end) - self.second.start

    def __str__(self) -> str:
        return (
            f"{self.first.prompt}: on {self.first.server} {self.first.start:.1f}-"
            f"{self.first.end:.1f} ({self.first.outcome}) and on {self.second.server} "
            f"{self.second.start:.1f}-{self.second.end:.1f} ({self.second.outcome})"
        )


def read_request_log(path: Path, server: str, ids: Mapping[str, str]) -> tuple[list[Request], int]:
    """The requests of one server's log whose prompt digest is in `ids` (digest -> prompt id),
    and how many named no known prompt (a worker's start-up probe for token ids)."""
    requests: list[Request] = []
    unknown = 0
    if not path.exists():
        return requests, unknown
    for raw in path.read_bytes().splitlines():
        line = orjson.loads(raw)
        prompt = ids.get(line["prompt"])
        if prompt is None:
            unknown += 1
            continue
        requests.append(Request(prompt, server, line["start"], line["end"], line["outcome"]))
    return requests, unknown


def by_prompt(requests: Iterable[Request]) -> dict[str, list[Request]]:
    found: dict[str, list[Request]] = defaultdict(list)
    for request in requests:
        found[request.prompt].append(request)
    for asked in found.values():
        asked.sort(key=lambda r: r.start)
    return dict(found)


def requested_more_than_once(requests: Iterable[Request]) -> dict[str, int]:
    """Prompts a server was asked for more than once, with how many times."""
    return {p: len(asked) for p, asked in by_prompt(requests).items() if len(asked) > 1}


def redone_generations(requests: Iterable[Request]) -> int:
    """Whole answers beyond the first of their prompt: GPU time spent twice."""
    return sum(
        max(0, sum(r.outcome == "ok" for r in asked) - 1) for asked in by_prompt(requests).values()
    )


def overlaps(
    requests: Iterable[Request], excused: Callable[[Overlap], bool] = lambda _o: False
) -> list[Overlap]:
    """Pairs of requests of one prompt on two servers running at the same time, but those
    `excused` says may (a request of a worker whose claim lapsed)."""
    found = []
    for asked in by_prompt(requests).values():
        for i, first in enumerate(asked):
            for second in asked[i + 1 :]:
                if second.server != first.server and second.start < first.end:
                    overlap = Overlap(first, second)
                    if not excused(overlap):
                        found.append(overlap)
    return found


def _down(outages: Sequence[Outage], server: str, at: float) -> bool:
    return any(o.server == server and o.start <= at < o.end for o in outages)


def _outside_outages(request: Request, outages: Sequence[Outage]) -> float:
    """The request's running time, less what its server spent unable to serve."""
    inside = sum(
        max(0.0, min(request.end, o.end) - max(request.start, o.start))
        for o in outages
        if o.server == request.server
    )
    return max(0.0, request.end - request.start - inside)


def finish_times(
    requests: Iterable[Request], prompts: Iterable[str], end: float
) -> dict[str, float]:
    """When each prompt was done: the end of its first whole answer, else of its last request
    (a failure for good), else `end` (never served)."""
    asked = by_prompt(requests)
    done = {}
    for prompt in prompts:
        mine = asked.get(prompt, [])
        ok = [r.end for r in mine if r.outcome == "ok"]
        done[prompt] = min(ok) if ok else max((r.end for r in mine), default=end)
    return done


def idle_slot_seconds(
    requests: Sequence[Request],
    published: Mapping[str, float],
    servers: Sequence[str],
    slots: int,
    outages: Sequence[Outage] = (),
    end: float | None = None,
) -> float:
    """Slot-seconds a healthy server had a free slot while a published prompt, not yet done,
    was running nowhere: min(free healthy slots, waiting prompts), integrated over time. A
    prompt is done at its first whole answer (`finish_times`, never-served ones at `end`)."""
    if not published:
        return 0.0
    last = max((r.end for r in requests), default=max(published.values()))
    end = last if end is None else end
    done = finish_times(requests, published, end)
    events: list[tuple[float, str, int]] = []  # (time, server or "" for waiting, delta)
    for prompt, asked in by_prompt(r for r in requests if r.prompt in published).items():
        # waiting: from its publish until it is done, except while a request of it runs
        moments, at = [], published[prompt]
        for request in asked:
            if request.start > at:
                moments.append((at, request.start))
            at = max(at, request.end)
        moments.append((at, done[prompt]))
        events += [e for a, b in moments if b > a for e in ((a, "", 1), (b, "", -1))]
    for prompt in published.keys() - {r.prompt for r in requests}:
        events += [(published[prompt], "", 1), (done[prompt], "", -1)]
    for request in requests:
        events += [(request.start, request.server, 1), (request.end, request.server, -1)]
    times = sorted(
        {t for t, _, _ in events} | {t for o in outages for t in (o.start, o.end) if t < end}
    )
    deltas: dict[float, list[tuple[str, int]]] = defaultdict(list)
    for at, who, delta in events:
        deltas[at].append((who, delta))
    running: dict[str, int] = defaultdict(int)
    waiting, idle = 0, 0.0
    for at, following in zip(times, [*times[1:], end], strict=True):
        for who, delta in deltas.get(at, []):
            if who:
                running[who] += delta
            else:
                waiting += delta
        span = min(following, end) - at
        if span <= 0:
            continue
        free = sum(max(0, slots - running[s]) for s in servers if not _down(outages, s, at))
        idle += min(free, waiting) * span
    return idle


def best_possible_s(
    requests: Sequence[Request],
    servers: Sequence[str],
    slots: int,
    start: float,
    outages: Sequence[Outage] = (),
) -> float:
    """The shortest run: each prompt's generation time (its first whole answer, less any
    pause of its server) spread over the healthy slots from `start`, never shorter than the
    longest one."""
    work = {}
    for prompt, asked in by_prompt(requests).items():
        ok = [_outside_outages(r, outages) for r in asked if r.outcome == "ok"]
        if ok:
            work[prompt] = ok[0]
    if not work:
        return 0.0
    total, longest = sum(work.values()), max(work.values())
    # capacity changes only at the outages' edges: fill each stretch until the work is done
    edges = sorted({start} | {t for o in outages for t in (o.start, o.end) if start < t < math.inf})
    left = total
    for at, following in zip(edges, [*edges[1:], math.inf], strict=True):
        healthy = slots * sum(not _down(outages, s, at) for s in servers)
        if healthy and left <= healthy * (following - at):
            return max(longest, at + left / healthy - start)
        left -= healthy * (following - at)
    return math.inf  # every server down for good: it never finishes


@dataclass(frozen=True)
class WorkFigures:
    prompts: int
    requested_more_than_once: int
    redone: int  # whole answers beyond a prompt's first
    overlaps: int  # not excused
    excused_overlaps: int
    idle_slot_s: float
    finish_s: float  # from the publish until the last prompt was done
    best_s: float

    def line(self) -> str:
        return (
            f"prompts {self.prompts}, requested more than once {self.requested_more_than_once}, "
            f"redone {self.redone}, overlaps {self.overlaps} (+{self.excused_overlaps} excused), "
            f"idle healthy slot-s {self.idle_slot_s:.1f}, finish {self.finish_s:.1f}s against "
            f"best {self.best_s:.1f}s"
        )


def work_figures(
    requests: Sequence[Request],
    published: Mapping[str, float],
    servers: Sequence[str],
    slots: int,
    outages: Sequence[Outage] = (),
    excused: Callable[[Overlap], bool] = lambda _o: False,
    end: float | None = None,
) -> WorkFigures:
    """Every figure above for one run; `end`: when the run was given up (default: the last
    request's end)."""
    mine = [r for r in requests if r.prompt in published]
    start = min(published.values())
    last = end if end is not None else max((r.end for r in mine), default=start)
    every = overlaps(mine)
    kept = overlaps(mine, excused)
    return WorkFigures(
        prompts=len(published),
        requested_more_than_once=len(requested_more_than_once(mine)),
        redone=redone_generations(mine),
        overlaps=len(kept),
        excused_overlaps=len(every) - len(kept),
        idle_slot_s=idle_slot_seconds(mine, published, servers, slots, outages, last),
        finish_s=max(finish_times(mine, published, last).values()) - start,
        best_s=best_possible_s(mine, servers, slots, start, outages),
    )
