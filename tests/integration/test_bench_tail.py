"""The tail benchmark's quick mode (tests/benchmarks/bench_tail.py --quick) runs to the end and
writes its figures: a smoke test of the benchmark's machinery, no timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.bench]

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_tail.py"


def test_the_tail_benchmark_quick_mode_completes_with_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "tail.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out)],
        capture_output=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    assert b"best possible" in done.stdout
    (summary,) = json.loads(out.read_text())["results"]
    assert summary["servers"] == 2 and summary["prompts"] > 0
    assert summary["best_possible_s"] > 0 and summary["capacity_s"] > 0
    assert summary["output_tokens"] > 0
    for name in ("batch", "draftgen", "draftgen cold"):
        figures = summary["clients"][name]
        assert figures["wall_median_s"] > 0 and figures["with_startup_median_s"] > 0
        assert figures["cpu_ms_per_prompt"] > 0 and figures["peak_rss_mib"] > 0
        for run in figures["runs"]:
            assert run["requests"] >= run["prompts"] and run["duplicates"] >= 0
            assert run["failures"] == 0
