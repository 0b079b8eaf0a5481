"""The replay benchmark's quick mode, as a smoke test: it runs end to end and measures what it
says (no timing is asserted; the figures are in BENCHMARKS.md)."""

from __future__ import annotations

import pytest

from tests.benchmarks import bench_replay


@pytest.mark.integration
@pytest.mark.bench
def test_the_replay_benchmark_rebuilds_every_completion_with_each_worker_count() -> None:
    results = bench_replay.main(["--quick"])
    runs = [r for rs in results.values() for r in rs]
    assert sorted(results) == [1, 2]
    assert {r.samples for r in runs} == {60}
    assert len({r.tokens for r in runs}) == 1
    assert all(r.cpu_s > 0 and r.peak_rss_mb > 0 for r in runs)
