"""`draftgen worker generate`: the Faust app around GenerateWorker, bound to one SGLang server."""

from __future__ import annotations

import time
from typing import Any

import faust

from streams.core.crash_guard import CrashGuard
from streams.core.faust_app import consume, create_app, kafka_sender, raw_topic
from streams.core.records import CompletionRecord, PromptRecord
from streams.core.settings import (
    COMPLETIONS,
    DEAD_LETTERS,
    DEFAULT_CONCURRENCY,
    GENERATE_GROUP,
    GENERATED,
    PROMPTS,
    GenerateSettings,
    ObserveSettings,
    OnceSettings,
    generate_prefetch,
)
from streams.generate.client import AUTH, SGLangClient
from streams.generate.fair import FairTurns
from streams.generate.once import OnceGenerateWorker
from streams.generate.steal import Stealer
from streams.generate.worker import GenerateStats, GenerateWorker
from streams.ops.metrics import Figures, GenerateMetrics
from streams.ops.observe import install


def generate_figures(stats: GenerateStats, requests: int, unreachable: bool = False) -> Figures:
    """`unreachable`: the server has not answered since the worker started (it waits)."""
    paused = stats.paused or unreachable
    return Figures(
        counters={
            "requests": requests,
            "completed": stats.completed,
            "dead_letters": stats.dead_letters,
            "retries": stats.retries,
            "output_tokens": stats.output_tokens,
            "errors": sum(stats.errors.values()),
            "skipped": stats.skipped,
            "stolen": stats.stolen,
        },
        gauges={
            "in_flight": stats.in_flight,
            "paused": 1.0 if paused else 0.0,
            "paused_auth": 1.0 if stats.paused_for == AUTH else 0.0,
        },
        errors=dict(stats.errors),
        notes={"exact_ids": stats.exact_ids} if stats.exact_ids else {},
    )


class TimedClient(SGLangClient):
    """Counts requests and times the successful ones; failures are counted by the worker."""

    def __init__(self, settings: GenerateSettings, metrics: GenerateMetrics):
        super().__init__(settings)
        self.metrics = metrics

    async def complete(self, prompt: PromptRecord) -> CompletionRecord:
        self.metrics.requests += 1
        started = time.monotonic()
        completion = await super().complete(prompt)
        self.metrics.observe(time.monotonic() - started)
        return completion


def observe_generate(
    app: faust.App, worker: GenerateWorker, metrics: GenerateMetrics, settings: ObserveSettings
) -> str | None:
    metrics.attach(
        lambda: generate_figures(worker.stats, metrics.requests, unreachable=worker.server.down)
    )
    return install(app, worker.settings.kafka, metrics, settings, worker.broker)


def build_generate_app(
    settings: GenerateSettings,
    observe: ObserveSettings | None = None,
    once: OnceSettings | None = None,
) -> tuple[faust.App, GenerateWorker]:
    kafka = settings.kafka
    # the consumer is configured before the server is asked (--concurrency auto): the default
    worker_concurrency = settings.concurrency
    if not isinstance(worker_concurrency, int):
        worker_concurrency = DEFAULT_CONCURRENCY
    app = create_app(
        kafka.group(GENERATE_GROUP),
        kafka,
        # Prefetch bounds what a worker holds beyond its in-flight requests, so a slow server
        # does not sit on a backlog that idle workers could take.
        prefetch=generate_prefetch(worker_concurrency),
        instance_id=settings.instance_id,
    )
    metrics = GenerateMetrics(settings.server)
    observe = observe or ObserveSettings()
    # each prompt once per generation settings (ledger), optionally stealing at the end
    once = once or OnceSettings()
    identity = settings.instance_id or settings.server
    guard = CrashGuard(observe.state_dir, f"{kafka.group(GENERATE_GROUP)}-{identity}")
    worker = OnceGenerateWorker(
        settings,
        TimedClient(settings, metrics),
        kafka_sender(app),
        completions_topic=kafka.topic(COMPLETIONS),
        dead_letters_topic=kafka.topic(DEAD_LETTERS),
        ledger_topic=kafka.topic(GENERATED),
        once=once,
    )
    worker.guard = guard
    observe_generate(app, worker, metrics, observe)
    # each partition in turn, not whole backlogs one after another (streams/generate/fair.py)
    turns = FairTurns(lambda: app.consumer)

    @app.agent(raw_topic(app, kafka.topic(PROMPTS)), name="generate")
    async def generate(stream: Any) -> None:
        worker.start_soon()  # the agent starts before the group is joined: ask the server now
        # Acks are ours (ordered, after delivery): see streams/generate/inflight.py.
        await consume(stream, guard, turns.wrap(worker.submit))

    @app.task
    async def end_idle_rounds() -> None:
        await turns.run()

    if once.steal_after_s > 0 and once.ledger:
        prompts = kafka.topic(PROMPTS)

        def owned() -> set[int]:
            return {tp.partition for tp in app.consumer.assignment() if tp.topic == prompts}

        stealer = Stealer(worker, kafka, prompts, kafka.group(GENERATE_GROUP), owned)

        @app.task
        async def steal() -> None:
            await worker._ready.wait()
            await stealer.run()

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # faust types are narrower than its runtime
    async def on_revoked(sender: Any, *args: Any, **_: Any) -> None:
        worker.forget_partitions(args[0])  # faust sends the revoked set positionally

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def on_shutdown(sender: Any, *_: Any, **__: Any) -> None:
        await worker.stop()

    return app, worker
