"""The replay benchmark's results and how it prints them: throughput, CPU per token, memory,
and for warm runs what their time went to (tests/benchmarks/bench_replay.py)."""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import dataclass, field

from tests.benchmarks.bench_tokenize import Measure
from tests.benchmarks.cgroups import Throttling
from tests.benchmarks.replay_produce import (
    PARTITIONS,
)

KIMI_RUN_TOKENS = 1_870_000_000
KIMI_RUN_SAMPLES = 902_087
CORES_16 = 16


@dataclass
class Result:
    workers: int
    seconds: float
    steady_s: float
    samples: int
    tokens: int
    cpu_s: float
    peak_rss_mb: float
    # warm runs: how long producing the completions took (the workers consumed meanwhile)
    producing_s: float = 0.0
    extra: WarmFigures | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def steady_tokens_per_s(self) -> float:
        return self.tokens / self.steady_s

    @property
    def cpu_us_per_token(self) -> float:
        return self.cpu_s * 1e6 / self.tokens


@dataclass
class WarmFigures:
    """What a warm run's time went to, besides the tokens."""

    quota: float | None  # cores per worker, None: uncapped
    worker_cpu_s: list[float]  # each worker's user+system seconds over the run
    throttling: Throttling  # summed over the workers' groups, over the run
    idle_cpu_per_s: float  # a worker's CPU per second joined and idle, before the run
    lag_after_producing: int  # completions not yet committed when the last was acked
    windows: int  # markers written
    superseded: int  # of those, overlapped by a newer writer's (redone)
    epochs: list[int] = field(default_factory=list)  # of the windows written
    readopted: int = 0  # partitions adopted again during the run (a rebalance)
    # seconds from the start to each worker's last partition being caught up
    finished_s: list[float] = field(default_factory=list)
    rows_per_window: float = 0.0
    warmup: int = 0  # completions through the workers before the clock (not counted)
    ready_s: float = 0.0  # from the spawn to joined with the encoder ready (capped too)
    warmup_cpu_s: float = 0.0  # a worker's CPU for the warm-up completions

    def budget_use(self, seconds: float) -> float:
        """The workers' CPU over their budgets (or over the machine when uncapped)."""
        cores = self.quota or (os.cpu_count() or 1) / len(self.worker_cpu_s)
        return sum(self.worker_cpu_s) / (cores * len(self.worker_cpu_s) * seconds)


def print_warm_run(r: Result) -> None:
    """One run's figures as soon as it ends (the table comes at the end)."""
    x = r.extra
    assert x is not None
    print(
        f"  {r.workers} workers (ready in {x.ready_s:.0f} s; {x.warmup} completions to warm "
        f"up, {x.warmup_cpu_s:.1f} CPU s a worker): {r.seconds:.1f} s, {r.tokens:,} tokens, "
        f"producing "
        f"{r.producing_s:.1f} s (lag then {x.lag_after_producing}), workers' CPU "
        f"{' '.join(f'{c:.1f}' for c in x.worker_cpu_s)} s, budget use "
        f"{x.budget_use(r.seconds):.0%}, idle {x.idle_cpu_per_s * 1000:.0f} ms/s a worker, "
        f"throttled {x.throttling.throttled}/{x.throttling.periods} periods "
        f"({x.throttling.throttled_s:.1f} s), windows {x.windows} "
        f"({x.rows_per_window:.0f} rows each), superseded {x.superseded}, epochs "
        f"{x.epochs}, re-adopted {x.readopted}, workers done at "
        f"{' '.join(f'{t:.1f}' for t in x.finished_s)} s",
        flush=True,
    )


def report_warm(
    warm: dict[int, list[Result]], args: argparse.Namespace, quota: float | None
) -> None:
    median = statistics.median
    first = warm[min(warm)]
    base = median([r.tokens_per_s for r in first])
    base_cpu = median([r.cpu_us_per_token for r in first])
    base_use = median([r.extra.budget_use(r.seconds) for r in first if r.extra])
    capped = f"each worker capped at {quota} core" if quota else "uncapped"
    if args.worker_args:
        capped += f", workers given {args.worker_args}"
    print(
        f"warm workers, {capped} (joined, encoders ready, {args.warmup} completions a "
        f"partition through them, then the {args.completions} completions produced): from "
        "the first send to the version caught up"
    )
    print(
        "workers  s (min–max)          tokens/s   ratio  eff.  producing s  CPU µs/token  "
        "budget use  throttled s  windows  superseded  last worker − first s  "
        "1.87B here  1.87B on 16 cores"
    )
    for n, runs in warm.items():
        seconds = [r.seconds for r in runs]
        rate = median([r.tokens_per_s for r in runs])
        cpu_per_token = median([r.cpu_us_per_token for r in runs]) / 1e6
        spread = f"{median(seconds):.1f} ({min(seconds):.1f}–{max(seconds):.1f})"
        extras = [r.extra for r in runs if r.extra is not None]
        use = median([r.extra.budget_use(r.seconds) for r in runs if r.extra])
        throttled = median([x.throttling.throttled_s for x in extras])
        windows = median([x.windows for x in extras])
        superseded = median([x.superseded for x in extras])
        tail = median([x.finished_s[-1] - x.finished_s[0] for x in extras if x.finished_s])
        print(
            f"{n:>7}  {spread:<18} {rate:>10,.0f}  {rate / base:5.2f}  {rate / base / n:4.2f}  "
            f"{median([r.producing_s for r in runs]):11.1f}  {cpu_per_token * 1e6:12.2f}  "
            f"{use:10.0%}  {throttled:11.1f}  {windows:7.0f}  {superseded:10.0f}  "
            f"{tail:21.1f}  {KIMI_RUN_TOKENS / rate / 3600:8.2f} h  "
            f"{KIMI_RUN_TOKENS * cpu_per_token / CORES_16 / 3600:15.2f} h"
        )
    if quota:
        print(
            "eff. = ratio / workers = (budget use ÷ 1 worker's) × (1 worker's CPU per token ÷ "
            f"this one's); 1 worker: budget use {base_use:.0%}, {base_cpu:.2f} µs/token"
        )
    else:
        print(
            "uncapped: the workers share the machine's cores with the broker and the producer, "
            "so the ratios show this machine's limit, not scaling"
        )


def report(
    results: dict[int, list[Result]], baseline: list[Measure], args: argparse.Namespace
) -> None:
    median = statistics.median
    base = results[min(results)]
    base_steady = median([r.steady_tokens_per_s for r in base])
    sample = base[0]
    encode = [m.tokens_per_s for m in baseline]
    print(
        f"encode_batch_fast on the same texts: {median(encode):,.0f} tokens/s "
        f"({min(encode):,.0f}–{max(encode):,.0f}); one worker's steady rate is "
        f"{base_steady / median(encode):.2f}× it"
    )
    print(
        f"replay of {args.completions} completions ({sample.tokens} tokens, "
        f"{sample.tokens / max(sample.samples, 1):.0f} per sample; the Kimi run averaged "
        f"{KIMI_RUN_TOKENS / KIMI_RUN_SAMPLES:.0f}), {PARTITIONS} partitions, {os.cpu_count()} "
        f"cores shared with the broker; medians of {args.repeats} (min–max)"
    )
    base_wall = median([r.tokens_per_s for r in base])
    print(
        "workers  wall s  tokens/s (wall)  ratio  steady tokens/s (min–max)       "
        "CPU µs/token  peak RSS MB  1.87B here (steady–wall)  1.87B on 16 cores"
    )
    for n, runs in results.items():
        wall = median([r.tokens_per_s for r in runs])
        steady = [r.steady_tokens_per_s for r in runs]
        cpu_per_token = median([r.cpu_us_per_token for r in runs]) / 1e6
        # a long run lies between: its start-up is amortized, its steady rate is not reached
        # by the work done before the first window commits
        here = (
            f"{KIMI_RUN_TOKENS / median(steady) / 3600:.2f}–{KIMI_RUN_TOKENS / wall / 3600:.2f} h"
        )
        cores16_h = KIMI_RUN_TOKENS * cpu_per_token / CORES_16 / 3600
        spread = f"({min(steady):,.0f}–{max(steady):,.0f})"
        print(
            f"{n:>7}  {median([r.seconds for r in runs]):6.1f}  {wall:>15,.0f}  "
            f"{wall / base_wall:5.2f}  {median(steady):>9,.0f} {spread:<22} "
            f"{cpu_per_token * 1e6:12.2f}  {median([r.peak_rss_mb for r in runs]):11.0f}  "
            f"{here:>24}  {cores16_h:15.2f} h"
        )
