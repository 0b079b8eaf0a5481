"""RSS over a soak, per process kind: is any process growing steadily? (issue 31)

The soak samples every process every ~10 s (process_sampler.Sampler). Per kind (kafka, an
emulator, generate and tokenize workers, ...) this reports the process of that kind that lived
longest through the steady state (the window after the warm-up until publishing stops), as a
leak shows in a long-lived process: its RSS at the start and end of that window (the median of
the first and last minute, so one sample's noise does not decide), the largest RSS any
process of the kind reached, and the least-squares slope in MiB per 10 minutes. "Flat": the
growth the slope predicts over the window is below `FLAT_MIB` or `FLAT_SHARE` of the start."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# growth over the steady window still called flat: noise of allocators and GC
FLAT_MIB = 5.0
FLAT_SHARE = 0.05
# the samples averaged at each end of the window
EDGE_S = 60.0
# fewer samples in the window: a short-lived process, no figure of the soak
MIN_SAMPLES = 3


@dataclass(frozen=True)
class Trace:
    """One process's RSS samples: seconds since the soak's start, MiB."""

    kind: str
    pid: int
    t: Sequence[float]
    rss_mb: Sequence[float]
    cpu_s: float = 0.0  # CPU time at its last sample


@dataclass(frozen=True)
class KindRss:
    kind: str
    processes: int  # of this kind over the whole soak (restarts and joins included)
    pid: int  # the longest-lived in the steady window: the one the figures below are of
    covered_s: float  # how much of the steady window it was sampled in
    start_mb: float
    end_mb: float
    max_mb: float  # over every process of the kind, the whole soak
    slope_mb_per_10min: float
    flat: bool

    def row(self) -> str:
        verdict = "flat" if self.flat else "GROWS"
        return (
            f"{self.kind:<16} {self.processes:>5} {self.covered_s / 60:>7.1f} "
            f"{self.start_mb:>8.1f} {self.end_mb:>8.1f} {self.max_mb:>8.1f} "
            f"{self.slope_mb_per_10min:>+9.2f}  {verdict}"
        )

    def as_json(self) -> dict[str, Any]:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()}


HEADER = (
    f"{'kind':<16} {'procs':>5} {'minutes':>7} {'start':>8} {'end':>8} {'max':>8} "
    f"{'MiB/10min':>9}  verdict"
)


def slope_per_s(t: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of y over t; 0 with fewer than two distinct times."""
    if len(t) < 2:
        return 0.0
    mean_t, mean_y = statistics.fmean(t), statistics.fmean(y)
    spread = sum((x - mean_t) ** 2 for x in t)
    if spread == 0:
        return 0.0
    return sum((x - mean_t) * (v - mean_y) for x, v in zip(t, y, strict=True)) / spread


def kind_rss(traces: Sequence[Trace], window: tuple[float, float]) -> KindRss | None:
    """The figures of one kind's processes over the steady `window` (seconds); None if none of
    them was sampled in it MIN_SAMPLES times."""
    if not traces:
        return None
    low, high = window

    def inside(trace: Trace) -> list[tuple[float, float]]:
        return [(t, r) for t, r in zip(trace.t, trace.rss_mb, strict=True) if low <= t <= high]

    longest = max(traces, key=lambda trace: len(inside(trace)))
    points = inside(longest)
    if len(points) < MIN_SAMPLES:
        return None  # a command run after the window (seal, export) or a passing helper
    times = [t for t, _ in points]
    rss = [r for _, r in points]
    first, last = times[0], times[-1]
    start = statistics.median(r for t, r in points if t <= first + EDGE_S)
    end = statistics.median(r for t, r in points if t >= last - EDGE_S)
    slope = slope_per_s(times, rss)
    growth = slope * (last - first)
    return KindRss(
        kind=traces[0].kind,
        processes=len(traces),
        pid=longest.pid,
        covered_s=last - first,
        start_mb=start,
        end_mb=end,
        max_mb=max(max(trace.rss_mb) for trace in traces),
        slope_mb_per_10min=slope * 600,
        flat=growth < max(FLAT_MIB, FLAT_SHARE * start),
    )


def rss_table(traces: Sequence[Trace], window: tuple[float, float]) -> list[KindRss]:
    """One row per kind, in the order kinds first appear."""
    by_kind: dict[str, list[Trace]] = {}
    for trace in traces:
        by_kind.setdefault(trace.kind, []).append(trace)
    rows = [kind_rss(group, window) for group in by_kind.values()]
    return [row for row in rows if row is not None]


def traces_of(series: Mapping[int, Any], kinds: Mapping[int, str]) -> list[Trace]:
    """The sampler's series (pid → Series), each named by `kinds` (the soak's own processes)
    or else by the sampler's label."""
    return [
        Trace(kinds.get(pid, s.label), pid, list(s.t), list(s.rss_mb), s.cpu_s)
        for pid, s in series.items()
        if s.t
    ]


def cpu_by_kind(traces: Sequence[Trace]) -> dict[str, float]:
    """CPU seconds per kind, every process of it (up to its last sample), largest first."""
    total: dict[str, float] = {}
    for trace in traces:
        total[trace.kind] = total.get(trace.kind, 0.0) + trace.cpu_s
    return dict(sorted(total.items(), key=lambda item: -item[1]))
