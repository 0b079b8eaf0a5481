"""Prometheus metrics of a worker, read from its stats object at scrape time.

The workers already count everything in plain ints (GenerateStats, TokenizeStats); the
collector turns those into metric families only when scraped, so the hot path pays nothing
extra. The two figures the stats do not hold, requests sent and their latency, are counted by
`TimedClient` around each request: one increment and one histogram observation per request.
The same figures feed the heartbeats `draftgen status` reads (streams/heartbeat.py).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from streams.core.errors import CliError

Kind = Literal["counter", "gauge"]


@dataclass(frozen=True)
class Figure:
    key: str  # name in heartbeats and `status --json`
    metric: str  # Prometheus name (counters get `_total` on exposition)
    doc: str
    kind: Kind = "counter"


@dataclass
class Figures:
    """One reading of a worker: cumulative counters, current gauges, errors by kind."""

    counters: dict[str, int] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    # facts worth a line, not a number (a server's way of returning exact ids); heartbeats only
    notes: dict[str, str] = field(default_factory=dict)


GENERATE_FIGURES = (
    Figure("in_flight", "draftgen_generate_in_flight", "requests in flight", "gauge"),
    Figure("paused", "draftgen_generate_paused", "1 while the worker is paused", "gauge"),
    Figure(
        "paused_auth",
        "draftgen_generate_paused_auth",
        "1 while paused because the server refuses the API key",
        "gauge",
    ),
    Figure("requests", "draftgen_generate_requests", "requests sent, retries included"),
    Figure("completed", "draftgen_generate_completed", "completions produced"),
    Figure("dead_letters", "draftgen_generate_dead_letters", "prompts dead-lettered"),
    Figure("retries", "draftgen_generate_retries", "requests retried after a transient error"),
    Figure("output_tokens", "draftgen_generate_output_tokens", "completion tokens generated"),
    Figure("errors", "draftgen_generate_errors", "failed requests, by kind"),
    Figure("skipped", "draftgen_generate_skipped", "prompts skipped: already generated"),
    Figure("stolen", "draftgen_generate_stolen", "prompts generated from others' backlogs"),
)

TOKENIZE_FIGURES = (
    Figure("samples", "draftgen_tokenize_samples", "samples in committed shards"),
    Figure("tokens", "draftgen_tokenize_tokens", "tokens in committed shards"),
    Figure("loss_tokens", "draftgen_tokenize_loss_tokens", "loss-masked tokens"),
    Figure("shards", "draftgen_tokenize_shards", "shards committed (with rows)"),
    Figure("duplicates", "draftgen_tokenize_duplicates", "completions replaced by a later one"),
    Figure("open_bytes", "draftgen_tokenize_open_bytes", "bytes held by open windows", "gauge"),
    Figure("peak_open_bytes", "draftgen_tokenize_peak_open_bytes", "most held at once", "gauge"),
    Figure("dead_letters", "draftgen_tokenize_dead_letters", "completions dead-lettered"),
    Figure("drift_compared", "draftgen_tokenize_drift_compared", "samples compared"),
    Figure("drifted", "draftgen_tokenize_drifted", "samples whose renderings drifted"),
    Figure("errors", "draftgen_tokenize_errors", "samples rejected, by kind"),
)

# Generations take seconds to many minutes.
LATENCY_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, float("inf"))


class WorkerMetrics(Collector):
    """One worker's registry; `read` is attached once the worker exists."""

    def __init__(self, role: str, label_name: str, label: str, figures: tuple[Figure, ...]):
        self.role = role
        self.label_name = label_name
        self.label = label
        self._figures = figures
        self._read: Callable[[], Figures] = Figures
        self.registry = CollectorRegistry()
        self.registry.register(self)
        ProcessCollector(registry=self.registry)

    def attach(self, read: Callable[[], Figures]) -> None:
        self._read = read

    def figures(self) -> Figures:
        return self._read()

    def describe(self) -> Iterator[Metric]:
        return iter(())  # names are fixed; nothing to check for collisions at registration

    def collect(self) -> Iterator[Metric]:
        current = self.figures()
        for figure in self._figures:
            if figure.key == "errors":
                errors = CounterMetricFamily(
                    figure.metric, figure.doc, labels=[self.label_name, "kind"]
                )
                for kind, count in sorted(current.errors.items()):
                    errors.add_metric([self.label, kind], count)
                yield errors
            elif figure.kind == "gauge":
                gauge = GaugeMetricFamily(figure.metric, figure.doc, labels=[self.label_name])
                gauge.add_metric([self.label], current.gauges.get(figure.key, 0.0))
                yield gauge
            else:
                counter = CounterMetricFamily(figure.metric, figure.doc, labels=[self.label_name])
                counter.add_metric([self.label], current.counters.get(figure.key, 0))
                yield counter


class GenerateMetrics(WorkerMetrics):
    def __init__(self, server: str):
        super().__init__("generate", "server", server.rstrip("/"), GENERATE_FIGURES)
        self.requests = 0
        self._latency = Histogram(
            "draftgen_generate_request_duration_seconds",
            "time to a successful completion, per request",
            ["server"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        ).labels(self.label)

    def observe(self, seconds: float) -> None:
        self._latency.observe(seconds)


class TokenizeMetrics(WorkerMetrics):
    def __init__(self, dataset: str):
        super().__init__("tokenize", "dataset", dataset, TOKENIZE_FIGURES)


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> str:
    """Serve /metrics from a daemon thread; returns its URL (port 0 picks a free port)."""
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as err:
        raise CliError(f"cannot serve metrics on {host}:{port}: {err.strerror}") from None
    bound = server.server_address[1]
    # a wildcard bind is reached through the host's name, which is what heartbeats should show
    shown = socket.gethostname() if host in ("", "0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{bound}/metrics"
