"""Prometheus metrics of a worker, read from its stats object at scrape time.

The workers already count everything in plain ints (GenerateStats, TokenizeStats), each figure
declared once on its stats field (streams/observe/figures.py); the collector turns those into
metric families only when scraped, so the hot path pays nothing extra. Request latency, which
the stats do not hold, is observed by the generate stage's timed client: one histogram
observation per request. The same figures feed the heartbeats `draftgen status` reads
(streams/observe/heartbeat.py).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from streams.core.errors import CliError
from streams.observe.figures import Figure, Figures

# the label of a figure counted by kind (`Figure.by_kind`: errors)
KIND_LABEL = "kind"
# the one metric not read from the stats: observed per request by the timed client
LATENCY_METRIC = "draftgen_generate_request_duration_seconds"
LATENCY_DOC = "time to a successful completion, per request"
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
            if figure.by_kind:
                errors = CounterMetricFamily(
                    figure.metric, figure.doc, labels=[self.label_name, KIND_LABEL]
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
    LABEL = "server"

    def __init__(self, server: str, figures: tuple[Figure, ...]):
        super().__init__("generate", self.LABEL, server.rstrip("/"), figures)
        self._latency = Histogram(
            LATENCY_METRIC,
            LATENCY_DOC,
            [self.LABEL],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        ).labels(self.label)

    def observe(self, seconds: float) -> None:
        self._latency.observe(seconds)


class TokenizeMetrics(WorkerMetrics):
    LABEL = "dataset"

    def __init__(self, dataset: str, figures: tuple[Figure, ...]):
        super().__init__("tokenize", self.LABEL, dataset, figures)


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
