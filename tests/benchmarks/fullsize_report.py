"""The full-size benchmark's figures as text: the three-size table and a run's summary
(tests/benchmarks/bench_fullsize.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# the rows of the three-size table: stage name, the processes whose CPU is the stage's
TABLE = (
    ("produce completions", ("bench helper",)),
    ("replay nodrift", ("replay worker", "replay (parent)")),
    ("replay drift", ("replay worker", "replay (parent)")),
    ("seal nodrift", ("seal",)),
    ("export nodrift", ("export",)),
    ("report nodrift", ("report",)),
)


def table(paths: Sequence[Path]) -> str:
    """The markdown table of the results of several scales, side by side."""
    results = [json.loads(Path(p).read_text()) for p in paths]
    head = " | ".join(f"scale {r['scale']}" for r in results)
    lines = [f"| stage: wall s / M tokens/s / CPU s per 1M tokens / peak RSS MiB | {head} |"]
    lines.append("|---" * (len(results) + 1) + "|")
    for name, labels in TABLE:
        cells = []
        for r in results:
            stage = next((s for s in r["stages"] if s["stage"] == name), None)
            if stage is None:
                cells.append("not run")
                continue
            tokens = r["data"]["tokens"]
            cpu = sum(stage["cpu_s"].get(label, 0.0) for label in labels)
            rss = stage.get("peak_rss_mb") or max(
                (stage.get("rss_mb", {}).get(label, 0.0) for label in labels), default=0.0
            )
            cells.append(
                f"{stage['wall_s']:,.1f} / {tokens / stage['wall_s'] / 1e6:.2f} / "
                f"{cpu / tokens * 1e6:.2f} / {rss:,.0f}"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    extra = {
        "records": lambda r: f"{r['records']:,}",
        "tokens": lambda r: f"{r['data']['tokens']:,}",
        "samples above 32K / 100K tokens": lambda r: (
            f"{r['data']['above_32k']:,} / {r['data']['above_100k']:,}"
        ),
        "topic on disk, as produced here (uncompressed)": lambda r: (
            f"{r['topic_bytes'] / 1e9:.2f} GB"
        ),
        "topic gzipped, as the pipeline stores it": lambda r: (
            f"{r['data']['gzip_record_bytes'] / 1e9:.2f} GB"
        ),
        "status after seal: s / peak MiB": _status_cell,
        "peak RSS of any process, MiB": lambda r: f"{max(r['peak_rss_mb'].values()):,.0f}",
    }
    for name, cell in extra.items():
        lines.append(f"| {name} | " + " | ".join(cell(r) for r in results) + " |")
    return "\n".join(lines)


def _status_cell(result: dict[str, Any]) -> str:
    seal = next((s for s in result["stages"] if s["stage"].startswith("seal")), None)
    status = (seal or {}).get("status")
    return f"{status['wall_s']:.1f} / {status['peak_rss_mb']:,.0f}" if status else "not run"


def summary(result: dict[str, Any]) -> None:
    tokens = result.get("data", {}).get("tokens", 0)
    print(f"\nscale {result.get('scale')}: {result.get('records', 0):,} records, {tokens:,} tokens")
    print(f"{'stage':<28} {'wall s':>8} {'tokens/s':>12} {'CPU s/1M tok':>13}  CPU by process")
    for stage in result.get("stages", []):
        cpu = stage.get("cpu_s", {})
        own = sum(v for k, v in cpu.items() if k not in ("kafka", "seaweedfs", "benchmark"))
        rate = tokens / stage["wall_s"] if stage["wall_s"] else 0
        per = own / tokens * 1e6 if tokens else 0
        print(
            f"{stage['stage']:<28} {stage['wall_s']:8.1f} {rate:12,.0f} {per:13.2f}  "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(cpu.items()) if v >= 0.5)
        )
    print(
        "peak RSS MiB: "
        + ", ".join(f"{k} {v:.0f}" for k, v in result.get("peak_rss_mb", {}).items())
    )
