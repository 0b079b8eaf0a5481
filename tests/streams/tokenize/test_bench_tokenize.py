"""The tokenize benchmark's quick mode, as a smoke test: it runs end to end and measures what it
says (no timing is asserted; the figures are in BENCHMARKS.md)."""

from __future__ import annotations

import pytest

from tests.benchmarks import bench_tokenize

pytestmark = pytest.mark.bench


def test_the_tokenize_benchmark_measures_every_mode_on_the_same_tokens() -> None:
    measures = bench_tokenize.main(["--quick"])
    assert {m.mode for m in measures} == set(bench_tokenize.MODES)
    # the stage's samples are exactly the texts encode_batch_fast encodes: same token count
    assert len({m.tokens for m in measures}) == 1 and measures[0].tokens > 0
    assert all(m.seconds > 0 and m.cpu_s > 0 and m.peak_rss_mb > 0 for m in measures)
