"""Makes a worker observable: `/metrics` for Prometheus and heartbeats for `draftgen status`.

`install` adds both to a Faust app; the worker's figures are read only on a scrape or once a
second for the heartbeat, never per record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from typing import Any

import faust

from streams.core.faust_app import kafka_sender, raw_topic
from streams.core.outage import Outage
from streams.core.settings import WORKER_STATS, KafkaSettings, ObserveSettings
from streams.observe.heartbeat import BeatSchedule, RateWindow, new_heartbeat, refresh
from streams.observe.metrics import WorkerMetrics, serve_metrics

log = logging.getLogger(__name__)


def install(
    app: faust.App,
    kafka: KafkaSettings,
    metrics: WorkerMetrics,
    settings: ObserveSettings,
    broker: Outage | None = None,
) -> str | None:
    """Start /metrics (if asked) and schedule heartbeats; returns the metrics URL. Each
    heartbeat's delivery tells `broker` whether the broker is reachable, so a worker with
    nothing to write still reports an outage and the reconnection."""
    url = None
    if settings.metrics_port is not None:
        url = serve_metrics(metrics.registry, settings.metrics_host, settings.metrics_port)
        print(f"draftgen worker {metrics.role}: metrics at {url}", file=sys.stderr, flush=True)
    if settings.heartbeat_s <= 0:
        return url

    beat = new_heartbeat(metrics.role, metrics.label, settings.heartbeat_s, url)
    window = RateWindow(settings.rate_window_s)
    send = kafka_sender(app)
    topic = kafka.topic(WORKER_STATS)
    key = beat.worker.encode()

    schedule = BeatSchedule(settings.heartbeat_s)

    @app.timer(interval=schedule.check_s)
    async def heartbeat() -> None:
        figures = metrics.figures()
        if not schedule.due(time.monotonic(), figures.notes):
            return
        refresh(beat, window, figures.counters, figures.gauges, figures.errors, figures.notes)
        started = time.monotonic()
        try:
            # bounded: a heartbeat is worth less than the worker's time; the next one follows
            await asyncio.wait_for(send(topic, key, beat.encode()), settings.heartbeat_s * 2)
        except Exception as err:
            log.debug("heartbeat not sent: %s", type(err).__name__)
            if broker is not None:
                took = time.monotonic() - started
                broker.failed(f"heartbeat not delivered: {type(err).__name__}", took)
        else:
            if broker is not None:
                broker.succeeded()

    @app.on_before_shutdown.connect  # type: ignore[arg-type]  # faust types are narrower than its runtime
    async def remove_heartbeat(sender: Any, *_: Any, **__: Any) -> None:
        # A tombstone, so `status` forgets a worker that stopped on purpose at once.
        with contextlib.suppress(Exception):
            delivery = await raw_topic(app, topic).send(key=key, value=None)
            await asyncio.wait_for(asyncio.shield(delivery), 5.0)  # as kafka_sender's

    return url
