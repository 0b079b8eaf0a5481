"""One run of the tail benchmark, and the summary of its runs (tests/benchmarks/bench_tail.py)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Run:
    client: str
    servers: int
    prompts: int
    # seconds from the first prompt sent/published to the last prompt done (committed)
    wall_s: float
    # seconds including start-up: from spawning the client's processes
    with_startup_s: float
    # draftgen: seconds to the last prompt's first completion landing in Kafka
    last_completion_s: float | None = None
    # draftgen: seconds `draftgen publish` took (its ledger read included)
    publish_s: float | None = None
    # seconds from the start to every slot of every server first busy, and last busy (then
    # the tail begins), sampled every 0.05 s; the mean share of slots busy over the run
    all_slots_busy_s: float | None = None
    last_all_busy_s: float | None = None
    busy_share: float = 0.0
    requests: int = 0
    duplicates: int = 0
    output_tokens: int = 0
    cpu_ms_per_prompt: float = 0.0
    broker_cpu_ms_per_prompt: float | None = None
    peak_rss_mib: float = 0.0
    failures: int = 0
    stolen_lines: int = 0
    tokens: list[int] = field(default_factory=list, repr=False)


def spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def summarize(servers: int, runs: list[Run], best_s: float, capacity_s: float) -> dict[str, Any]:
    clients: dict[str, Any] = {}
    for name in ("batch", "draftgen", "draftgen cold"):
        mine = [r for r in runs if r.client == name]
        if not mine:
            continue
        wall = [r.wall_s for r in mine]
        clients[name] = {
            "wall_s": wall,
            "wall_median_s": statistics.median(wall),
            "with_startup_s": [r.with_startup_s for r in mine],
            "with_startup_median_s": statistics.median(r.with_startup_s for r in mine),
            "ratio_to_best": statistics.median(wall) / best_s,
            "ratio_to_best_with_startup": statistics.median(r.with_startup_s for r in mine)
            / best_s,
            "capacity_share": capacity_s / statistics.median(wall),
            "duplicates": [r.duplicates for r in mine],
            "cpu_ms_per_prompt": statistics.median(r.cpu_ms_per_prompt for r in mine),
            "peak_rss_mib": max(r.peak_rss_mib for r in mine),
            "runs": [{k: v for k, v in asdict(r).items() if k != "tokens"} for r in mine],
        }
        completions = [r.last_completion_s for r in mine if r.last_completion_s is not None]
        if completions:
            clients[name]["last_completion_median_s"] = statistics.median(completions)
        for figure in ("publish_s", "all_slots_busy_s", "last_all_busy_s", "busy_share"):
            values = [getattr(r, figure) for r in mine if getattr(r, figure) is not None]
            if values:
                median = f"{figure.removesuffix('_s')}_median" + (
                    "_s" if figure.endswith("_s") else ""
                )
                clients[name][median] = statistics.median(values)
        broker = [r.broker_cpu_ms_per_prompt for r in mine if r.broker_cpu_ms_per_prompt]
        if broker:
            clients[name]["broker_cpu_ms_per_prompt"] = statistics.median(broker)
    return {
        "servers": servers,
        "prompts": runs[0].prompts,
        "best_possible_s": best_s,
        "capacity_s": capacity_s,
        "best_capacity_share": capacity_s / best_s,
        "clients": clients,
    }


def print_summary(summary: dict[str, Any]) -> None:
    s = summary
    print(
        f"\n{s['servers']} server(s), {s['prompts']} prompts: "
        f"best possible {s['best_possible_s']:.1f} s"
        f" (capacity {s['capacity_s']:.1f} s, best = {s['best_capacity_share']:.2f} of capacity)"
    )
    head = (
        f"  {'client':<14} {'wall s: median (min-max)':<26} {'x best':>6} {'of cap':>6} "
        f"{'+start-up s':>18} {'x best':>6} {'dup req':>10} {'CPU-ms/p':>8} {'RSS MiB':>8}"
    )
    print(head)
    for name, c in s["clients"].items():
        print(
            f"  {name:<14} {spread(c['wall_s']):<26} {c['ratio_to_best']:>6.2f} "
            f"{c['capacity_share']:>6.2f} {spread(c['with_startup_s']):>18} "
            f"{c['ratio_to_best_with_startup']:>6.2f} {','.join(map(str, c['duplicates'])):>10} "
            f"{c['cpu_ms_per_prompt']:>8.1f} {c['peak_rss_mib']:>8.0f}"
        )
        print(
            f"  {'':<14} every slot busy from {c.get('all_slots_busy_median_s') or 0:.1f} s to "
            f"{c.get('last_all_busy_median_s') or 0:.1f} s; slots busy on average "
            f"{c.get('busy_share_median', 0):.2f}"
        )
        if "last_completion_median_s" in c:
            print(
                f"  {'':<14} last completion in Kafka: "
                f"median {c['last_completion_median_s']:.1f} s; "
                f"publish took {c.get('publish_median_s', 0):.1f} s;"
                f" broker CPU-ms/prompt {c.get('broker_cpu_ms_per_prompt', 0):.1f}"
            )
