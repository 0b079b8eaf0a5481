"""What the saturation benchmark computes from a run (tests/benchmarks/bench_saturation.py): slot
occupancy from the emulators' request logs, the ideal schedule's, CPU per process, and a
py-spy profile summarised by where the time went."""

from __future__ import annotations

import os
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


def read_requests(paths: list[Path], digests: dict[str, int]) -> tuple[list[Request], int]:
    """Every generation request of a known prompt, and how many others (each worker's probe
    for token ids) there were."""
    found, others = [], 0
    for path in paths:
        for line in path.read_bytes().splitlines():
            entry = orjson.loads(line)
            index = digests.get(entry["prompt"])
            if index is None:
                others += 1
                continue
            found.append(Request(index, entry["start"], entry["end"], entry["outcome"]))
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
    ideal_s: float  # the ideal schedule's makespan
    whole: float  # kept slot-seconds / (slots x wall)
    whole_busy: float  # the same with every request (duplicates and failures too)
    whole_ideal: float  # kept slot-seconds / (slots x ideal makespan)
    steady_from_s: float | None  # every slot first busy (from the publish)
    steady_to_s: float  # the last prompt's first request started (nothing left to start)
    steady: float | None  # kept slot-seconds / (slots x steady window)
    steady_busy: float | None
    wasted_slot_s: float  # slot-seconds of requests whose answer was not kept
    extra_requests: int  # requests beyond one per prompt
    overhead_ms: float  # mean (observed duration - tokens / rate) of kept requests

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
    """`tokens`: each prompt's output length, in arrival order; the ideal is list scheduling in
    that order onto the earliest free slot from the publish (bench_tail.best_possible)."""
    from tests.benchmarks.bench_tail import best_possible

    slots = servers * slots_per_server
    durations = [count / tokens_per_s for count in tokens]
    answers = kept(requests)
    missing = len(durations) - len(answers)
    if missing:
        raise RuntimeError(f"{missing} prompts have no whole answer in the request logs")
    end = max(r.end for r in answers.values())
    useful = [(r.start, r.end) for r in answers.values()]
    every = [(r.start, r.end) for r in requests]
    wall = end - t0
    ideal = best_possible(tokens, servers, slots_per_server, tokens_per_s)
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
    return Occupancy(
        slots=slots,
        wall_s=wall,
        ideal_s=ideal,
        whole=busy_integral(useful, t0, end) / (slots * wall),
        whole_busy=busy_integral(every, t0, end) / (slots * wall),
        whole_ideal=sum(durations) / (slots * ideal),
        steady_from_s=None if full is None else full - t0,
        steady_to_s=last_start - t0,
        steady=steady,
        steady_busy=steady_busy,
        wasted_slot_s=sum(r.end - r.start for r in requests if id(r) not in kept_ids),
        extra_requests=len(requests) - len(durations),
        overhead_ms=1000
        * sum(r.end - r.start - durations[p] for p, r in answers.items())
        / len(answers),
    )


# -- CPU ---------------------------------------------------------------------------------------


def machine_busy_s() -> float:
    """CPU-seconds the whole machine has been busy (all cores; /proc/stat: not idle, iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICKS


# -- profile -----------------------------------------------------------------------------------

# (where a leaf frame's file lies, the name it is counted under); the first match wins
_PLACES = (
    ("/aiokafka/", "aiokafka"),
    ("/kafka/", "kafka-python"),
    ("/faust/", "faust"),
    ("/mode/", "mode (faust's services)"),
    ("/aiohttp/", "aiohttp"),
    ("/yarl/", "aiohttp"),
    ("/multidict/", "aiohttp"),
    ("/openai/", "openai"),
    ("/httpx/", "httpx"),
    ("/httpcore/", "httpx"),
    ("/pydantic", "pydantic"),
    ("/asyncio/", "asyncio (event loop)"),
    ("/selectors.py", "asyncio (event loop)"),
    ("/ssl.py", "ssl"),
    ("/socket.py", "socket"),
    ("/logging/", "logging"),
    ("/json/", "json"),
    ("/streams/generate/", "draftgen: streams/generate"),
    ("/streams/core/", "draftgen: streams/core"),
    ("/streams/", "draftgen: streams (other)"),
)


def _place(frame: str) -> str:
    path = frame[frame.rfind("(") + 1 :] if "(" in frame else frame
    for needle, name in _PLACES:
        if needle in path:
            return name
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0].split(".", 1)[0]
    if "python3." in path:
        return "stdlib: " + path.rsplit("/", 1)[-1].split(":", 1)[0]
    return frame.split(" ", 1)[0] or "?"


def summarize_profile(raw: Path, top: int = 15) -> dict[str, object]:
    """py-spy's raw (collapsed) output: the share of busy samples by where the leaf frame is,
    the top leaf functions, and the top draftgen functions by inclusive share."""
    places: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        places[_place(frames[-1])] += count
        leaves[frames[-1]] += count
        for frame in {f for f in frames if "/streams/" in f and "/faust/" not in f}:
            ours[frame.split(" (", 1)[0] + " " + frame.rsplit("/", 1)[-1].rstrip(")")] += count

    def share(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, round(n / total, 4)) for name, n in counter.most_common(top)]

    return {
        "samples": total,
        "by_place": share(places) if total else [],
        "top_leaves": share(leaves) if total else [],
        "draftgen_inclusive": share(ours) if total else [],
    }
