"""Worker metrics: read from the worker's stats at scrape time, served on /metrics."""

from __future__ import annotations

import dataclasses
import urllib.request
from dataclasses import dataclass

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sinks.sink import SinkStats
from streams.generate.stats import GenerateStats, generate_figures
from streams.observe.figures import declared, figure, figure_of, note_of, read_figures
from streams.observe.metrics import GenerateMetrics, TokenizeMetrics, serve_metrics
from streams.tokenize.stats import TokenizeStats


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_generate_metrics_follow_the_stats_without_being_told() -> None:
    stats = GenerateStats()
    metrics = GenerateMetrics("http://gpu-01:30000/", declared(GenerateStats))
    metrics.attach(lambda: generate_figures(stats))
    server = (("server", "http://gpu-01:30000"),)

    stats.in_flight, stats.completed, stats.output_tokens = 3, 7, 4200
    stats.dead_letters, stats.retries, stats.paused, stats.paused_for = 1, 2, True, "auth"
    stats.skipped, stats.stolen = 5, 6
    stats.errors.update({"http_503": 2, "context_too_long": 1})
    stats.requests = 10
    metrics.observe(1.5)
    metrics.observe(42.0)
    found = samples(generate_latest(metrics.registry).decode())

    assert found[("draftgen_generate_in_flight", server)] == 3
    assert found[("draftgen_generate_paused", server)] == 1
    assert found[("draftgen_generate_paused_auth", server)] == 1
    assert found[("draftgen_generate_requests_total", server)] == 10
    assert found[("draftgen_generate_completed_total", server)] == 7
    assert found[("draftgen_generate_dead_letters_total", server)] == 1
    assert found[("draftgen_generate_retries_total", server)] == 2
    assert found[("draftgen_generate_output_tokens_total", server)] == 4200
    assert found[("draftgen_generate_skipped_total", server)] == 5
    assert found[("draftgen_generate_stolen_total", server)] == 6
    assert found[("draftgen_generate_errors_total", (("kind", "http_503"), *server))] == 2
    assert found[("draftgen_generate_request_duration_seconds_count", server)] == 2
    assert found[("draftgen_generate_request_duration_seconds_sum", server)] == 43.5
    le_2_5 = (("le", "2.5"), *server)
    assert found[("draftgen_generate_request_duration_seconds_bucket", le_2_5)] == 1

    stats.completed = 8  # read again at the next scrape
    found = samples(generate_latest(metrics.registry).decode())
    assert found[("draftgen_generate_completed_total", server)] == 8


def test_tokenize_metrics_are_per_dataset() -> None:
    stats = TokenizeStats(samples=5, tokens=900, loss_tokens=400, shards=2, dead_letters=3)
    stats.drift_compared, stats.drifted = 5, 1
    stats.errors["bad_tool_call"] = 3
    sink = stats.sink = SinkStats(duplicates=1, open_bytes=1234, peak_open_bytes=5678)
    metrics = TokenizeMetrics("k26-v1", declared(TokenizeStats))
    metrics.attach(lambda: read_figures(stats))
    found = samples(generate_latest(metrics.registry).decode())
    ds = (("dataset", "k26-v1"),)
    for name, value in (
        ("samples", 5),
        ("tokens", 900),
        ("loss_tokens", 400),
        ("shards", 2),
        ("duplicates", 1),
        ("dead_letters", 3),
        ("drift_compared", 5),
        ("drifted", 1),
    ):
        assert found[(f"draftgen_tokenize_{name}_total", ds)] == value
    assert found[("draftgen_tokenize_open_bytes", ds)] == 1234  # gauges: no _total
    assert found[("draftgen_tokenize_peak_open_bytes", ds)] == 5678
    assert (
        found[
            ("draftgen_tokenize_errors_total", (("dataset", "k26-v1"), ("kind", "bad_tool_call")))
        ]
        == 3
    )

    sink.open_bytes = 0  # a gauge follows the sink down, too
    found = samples(generate_latest(metrics.registry).decode())
    assert found[("draftgen_tokenize_open_bytes", ds)] == 0


def test_metrics_endpoint_on_a_free_loopback_port() -> None:
    metrics = TokenizeMetrics("ds", declared(TokenizeStats))
    url = serve_metrics(metrics.registry, "127.0.0.1", 0)
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    assert not url.startswith("http://127.0.0.1:0/")
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read().decode()
    assert 'draftgen_tokenize_samples_total{dataset="ds"} 0.0' in body
    assert "process_cpu_seconds_total" in body


def test_a_figure_declared_once_on_its_stats_field_reaches_heartbeats_and_prometheus() -> None:
    @dataclass
    class ToyStats:
        widgets: int = figure("draftgen_toy_widgets", "widgets made")
        busy: bool = figure("draftgen_toy_busy", "1 while busy", "gauge", default=False)
        untracked: int = 0

    stats = ToyStats(widgets=4, busy=True, untracked=9)
    reading = read_figures(stats)
    assert (reading.counters, reading.gauges) == ({"widgets": 4}, {"busy": 1.0})
    metrics = TokenizeMetrics("toy", declared(ToyStats))
    metrics.attach(lambda: read_figures(stats))
    found = samples(generate_latest(metrics.registry).decode())
    assert found[("draftgen_toy_widgets_total", (("dataset", "toy"),))] == 4
    assert found[("draftgen_toy_busy", (("dataset", "toy"),))] == 1


def test_a_reader_names_a_figure_by_its_field_and_gets_its_declared_key() -> None:
    paused = figure_of(GenerateStats, lambda s: s.paused_for)
    assert (paused.key, paused.kind) == ("paused_auth", "gauge")  # key= differs from the field
    assert figure_of(GenerateStats, lambda s: s.completed).key == "completed"
    duplicates = figure_of(TokenizeStats, lambda s: s.sink.duplicates)  # a nested stats object
    assert (duplicates.key, duplicates.metric) == ("duplicates", "draftgen_tokenize_duplicates")
    assert figure_of(GenerateStats, lambda s: s.errors).by_kind
    assert note_of(GenerateStats, lambda s: s.exact_ids) == "exact_ids"
    with pytest.raises(LookupError, match="budget_flushes"):
        figure_of(TokenizeStats, lambda s: s.sink.budget_flushes)  # counted, not a figure
    with pytest.raises(LookupError, match="exact_ids"):
        figure_of(GenerateStats, lambda s: s.exact_ids)  # a note, not a figure


@pytest.mark.parametrize(
    ("stats_type", "role"), [(GenerateStats, "generate"), (TokenizeStats, "tokenize")]
)
def test_a_figure_has_one_name_its_fields_in_heartbeats_and_prometheus(
    stats_type: type, role: str
) -> None:
    """A figure's heartbeat key is its field's name (or the attribute it reads), and its
    Prometheus name is `draftgen_{role}_{key}`; only a figure computed from its field (a
    `value`) is named for what it computes."""
    for field in dataclasses.fields(stats_type):
        for fig in field.metadata.get("figures", ()):
            key = fig.key or field.name
            if fig.value is None:
                assert key == (fig.attr or field.name), (field.name, key)
            assert fig.metric == f"draftgen_{role}_{key}", (field.name, fig.metric)
