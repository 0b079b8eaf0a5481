"""What the saturation benchmark computes from a run (tests/benchmarks/bench_saturation.py): slot
occupancy from the emulators' request logs, the ideal schedule's, CPU per process, and a
py-spy profile summarised by where the time went."""

from __future__ import annotations

import bisect
import os
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import orjson

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Request:
    prompt: int  # index in the prompts file (arrival order)
    start: float
    end: float
    outcome: str  # compose/emulator/request_log.py: ok, cut, reset, http_N, gone
    server: int = 0  # index of the server (of its request log)


def read_requests(paths: list[Path], digests: dict[str, int]) -> tuple[list[Request], int]:
    """Every generation request of a known prompt, and how many others (each worker's probe
    for token ids) there were."""
    found, others = [], 0
    for server, path in enumerate(paths):
        for line in path.read_bytes().splitlines():
            entry = orjson.loads(line)
            index = digests.get(entry["prompt"])
            if index is None:
                others += 1
                continue
            found.append(Request(index, entry["start"], entry["end"], entry["outcome"], server))
    return found, others


def kept(requests: list[Request]) -> dict[int, Request]:
    """Per prompt, its first whole answer: the generation the run keeps; the others are waste."""
    first: dict[int, Request] = {}
    for request in sorted(requests, key=lambda r: r.end):
        if request.outcome == "ok" and request.prompt not in first:
            first[request.prompt] = request
    return first


def busy_integral(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Slot-seconds of the intervals inside [lo, hi]."""
    return sum(max(0.0, min(end, hi) - max(start, lo)) for start, end in intervals)


def first_full(intervals: list[tuple[float, float]], slots: int) -> float | None:
    """The first moment `slots` intervals overlap (every slot of the fleet busy)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = 0
    for moment, step in events:  # at a tie an end (-1) sorts first: a freed slot is not busy
        running += step
        if running >= slots:
            return moment
    return None


@dataclass
class Occupancy:
    slots: int  # of the whole fleet
    wall_s: float  # from the publish to the last kept answer's end
    ideal_s: float  # the ideal schedule's makespan, of the kept answers' observed durations
    ideal_tokens_s: float  # the same of tokens / rate (what the servers are asked to take)
    whole: float  # kept slot-seconds / (slots x wall)
    whole_busy: float  # the same with every request (duplicates and failures too)
    whole_ideal: float  # kept slot-seconds / (slots x ideal makespan)
    steady_from_s: float | None  # every slot first busy (from the publish)
    steady_to_s: float  # the last prompt's first request started (nothing left to start)
    steady: float | None  # kept slot-seconds / (slots x steady window)
    steady_busy: float | None
    wasted_slot_s: float  # slot-seconds of requests whose answer was not kept
    extra_requests: int  # requests beyond one per prompt
    stretch: float  # kept requests' observed durations / (tokens / rate), summed
    # per server: kept slot-seconds / (its slots x the steady window), and when (from the
    # publish) its last prompt started: a server low here ran out of prompts before the others
    steady_by_server: list[float] | None
    last_start_by_server: list[float]
    # a slot freed in the steady window: the median and 90th percentile time to its server's
    # next request (the worker's turnaround: answer read, completion produced, next sent)
    refill_ms: tuple[float, float] | None

    @property
    def whole_vs_ideal(self) -> float:
        return self.whole / self.whole_ideal

    def as_dict(self) -> dict[str, float | int | None]:
        figures = {k: v for k, v in vars(self).items()}
        figures["whole_vs_ideal"] = self.whole_vs_ideal
        return figures


def occupancy(
    requests: list[Request],
    tokens: list[int],
    tokens_per_s: float,
    servers: int,
    slots_per_server: int,
    t0: float,
) -> Occupancy:
    """`tokens`: each prompt's output length, in arrival order. The ideal is list scheduling in
    that order onto the earliest free slot from the publish (bench_tail.best_possible) of the
    durations the servers took for the answers kept: so it differs from the run by scheduling
    alone, not by the emulator's timers (an asyncio sleep overshoots by ~0.5% here)."""
    from tests.benchmarks.bench_tail import best_possible

    slots = servers * slots_per_server
    answers = kept(requests)
    missing = len(tokens) - len(answers)
    if missing:
        raise RuntimeError(f"{missing} prompts have no whole answer in the request logs")
    end = max(r.end for r in answers.values())
    useful = [(r.start, r.end) for r in answers.values()]
    every = [(r.start, r.end) for r in requests]
    wall = end - t0
    observed = [answers[p].end - answers[p].start for p in range(len(tokens))]
    ideal = best_possible(
        [d * tokens_per_s for d in observed], servers, slots_per_server, tokens_per_s
    )
    first_started: dict[int, float] = {}
    for r in requests:
        first_started[r.prompt] = min(r.start, first_started.get(r.prompt, r.start))
    last_start = max(first_started.values())
    full = first_full(useful, slots)
    steady = steady_busy = None
    if full is not None and last_start > full:
        window = slots * (last_start - full)
        steady = busy_integral(useful, full, last_start) / window
        steady_busy = busy_integral(every, full, last_start) / window
    kept_ids = {id(r) for r in answers.values()}
    by_server = _by_server(list(answers.values()), servers, slots_per_server, full, last_start)
    return Occupancy(
        slots=slots,
        wall_s=wall,
        ideal_s=ideal,
        ideal_tokens_s=best_possible(tokens, servers, slots_per_server, tokens_per_s),
        whole=busy_integral(useful, t0, end) / (slots * wall),
        whole_busy=busy_integral(every, t0, end) / (slots * wall),
        whole_ideal=sum(observed) / (slots * ideal),
        steady_from_s=None if full is None else full - t0,
        steady_to_s=last_start - t0,
        steady=steady,
        steady_busy=steady_busy,
        wasted_slot_s=sum(r.end - r.start for r in requests if id(r) not in kept_ids),
        extra_requests=len(requests) - len(tokens),
        stretch=sum(observed) * tokens_per_s / sum(tokens),
        steady_by_server=by_server[0],
        last_start_by_server=[t - t0 for t in by_server[1]],
        refill_ms=by_server[2],
    )


def _by_server(
    answers: list[Request], servers: int, slots: int, full: float | None, last: float
) -> tuple[list[float] | None, list[float], tuple[float, float] | None]:
    shares: list[float] = []
    last_starts: list[float] = []
    gaps: list[float] = []
    for server in range(servers):
        mine = [(r.start, r.end) for r in answers if r.server == server]
        last_starts.append(max((s for s, _ in mine), default=0.0))
        if full is None or last <= full:
            continue
        shares.append(busy_integral(mine, full, last) / (slots * (last - full)))
        starts = sorted(s for s, _ in mine if s >= full)
        later = 0
        for end in sorted(e for _, e in mine if full <= e <= last):
            later = bisect.bisect_left(starts, end, later)
            if later == len(starts):
                break
            gaps.append(starts[later] - end)
            later += 1
    refill = None
    if gaps:
        gaps.sort()
        refill = (1000 * statistics.median(gaps), 1000 * gaps[int(0.9 * (len(gaps) - 1))])
    return (shares or None), last_starts, refill


# -- CPU ---------------------------------------------------------------------------------------


def machine_busy_s() -> float:
    """CPU-seconds the whole machine has been busy (all cores; /proc/stat: not idle, iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICKS


# -- profile ---------------------------------------------------------------------------------


def _file(frame: str) -> str:
    """py-spy's frame `function (path/to/file.py:line)` -> `path/to/file.py` (relative to
    site-packages, the standard library or the working directory)."""
    inside = frame[frame.rfind("(") + 1 :].rstrip(")")
    return inside.rsplit(":", 1)[0]


def _stdlib(path: str) -> bool:
    top = path.split("/", 1)[0].removesuffix(".py")
    return path.startswith("<") or top in sys.stdlib_module_names


def _callback(frames: list[str]) -> list[str] | None:
    """The frames of the callback the event loop is running (after its last `_run_once` and
    `Handle._run`); None when the sample is in the loop itself (its epoll wait, scheduling)."""
    loops = [i for i, f in enumerate(frames) if f.startswith("BaseEventLoop._run_once ")]
    if not loops:
        return frames  # a thread without a loop
    callback = frames[loops[-1] + 1 :]
    if not callback or not callback[0].startswith("Handle._run "):
        return None
    return callback[1:]


def owner(callback: list[str]) -> str:
    """Who a callback works for: the library or draftgen package nearest the leaf."""
    for frame in reversed(callback):
        path = _file(frame)
        if _stdlib(path):
            continue
        if path.startswith("streams/"):
            return "draftgen " + "/".join(path.split("/")[:2])
        return path.split("/", 1)[0].removesuffix(".py")
    if not callback:
        return "asyncio (running callbacks)"
    return "standard library: " + _file(callback[-1]).split("/", 1)[0]


def summarize_profile(raw: Path, top: int = 15) -> dict[str, object]:
    """py-spy's raw (collapsed) output: the share of samples in the event loop itself (mostly
    its epoll wait, which py-spy often takes for busy), then, of the other samples, the share
    by who they work for (`owner`), the top leaf functions, and the top draftgen functions by
    inclusive share."""
    owners: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = loop = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        callback = _callback(frames)
        if callback is None:
            loop += count
            continue
        owners[owner(callback)] += count
        leaves[frames[-1]] += count
        for name in {f.split(" (", 1)[0] for f in callback if _file(f).startswith("streams/")}:
            ours[name] += count
    work = total - loop

    def share(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, round(n / work, 4)) for name, n in counter.most_common(top)]

    return {
        "samples": total,
        "event_loop_share": round(loop / total, 4) if total else 0.0,
        "by_owner": share(owners) if work else [],
        "top_leaves": share(leaves) if work else [],
        "draftgen_inclusive": share(ours) if work else [],
    }
