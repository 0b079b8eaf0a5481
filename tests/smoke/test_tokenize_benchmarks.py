"""The tokenize and replay benchmarks' quick modes, as smoke tests: they run end to end and
measure what they say (no timing is asserted; the figures are in BENCHMARKS.md)."""

from __future__ import annotations

import pytest

from tests.benchmarks import bench_replay, bench_tokenize


def test_the_tokenize_benchmark_measures_every_mode_on_the_same_tokens() -> None:
    measures = bench_tokenize.main(["--quick"])
    assert {m.mode for m in measures} == set(bench_tokenize.MODES)
    # the stage's samples are exactly the texts encode_batch_fast encodes: same token count
    assert len({m.tokens for m in measures}) == 1 and measures[0].tokens > 0
    assert all(m.seconds > 0 and m.cpu_s > 0 and m.peak_rss_mb > 0 for m in measures)


@pytest.mark.integration
def test_the_replay_benchmark_rebuilds_every_completion_with_each_worker_count() -> None:
    results = bench_replay.main(["--quick"])
    runs = [r for rs in results.values() for r in rs]
    assert sorted(results) == [1, 2]
    assert {r.samples for r in runs} == {60}
    assert len({r.tokens for r in runs}) == 1
    assert all(r.cpu_s > 0 and r.peak_rss_mb > 0 for r in runs)
