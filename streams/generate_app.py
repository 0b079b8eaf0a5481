"""`draftgen worker generate`: the Faust app around GenerateWorker, bound to one SGLang server."""

from __future__ import annotations

from typing import Any

import faust

from streams.faust_app import create_app, kafka_sender, raw_topic
from streams.generate import GenerateWorker
from streams.metrics import GenerateMetrics, TimedClient
from streams.observe import observe_generate
from streams.observe_args import ObserveSettings
from streams.settings import COMPLETIONS, DEAD_LETTERS, GENERATE_GROUP, PROMPTS, GenerateSettings


def build_generate_app(
    settings: GenerateSettings, observe: ObserveSettings | None = None
) -> tuple[faust.App, GenerateWorker]:
    kafka = settings.kafka
    app = create_app(
        kafka.group(GENERATE_GROUP),
        kafka,
        # Prefetch bounds what a worker holds beyond its in-flight requests, so a slow server
        # does not sit on a backlog that idle workers could take.
        prefetch=max(4, settings.concurrency // 4),
        instance_id=settings.instance_id,
    )
    metrics = GenerateMetrics(settings.server)
    worker = GenerateWorker(
        settings,
        TimedClient(settings, metrics),
        kafka_sender(app),
        completions_topic=kafka.topic(COMPLETIONS),
        dead_letters_topic=kafka.topic(DEAD_LETTERS),
    )
    observe_generate(app, worker, metrics, observe or ObserveSettings())

    @app.agent(raw_topic(app, kafka.topic(PROMPTS)), name="generate")
    async def generate(stream: Any) -> None:
        # Acks are ours (ordered, after delivery): see streams/inflight.py.
        async for event in stream.noack().events():
            await worker.submit(event)

    @app.task
    async def start_worker() -> None:
        await worker.start()

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # faust types are narrower than its runtime
    async def on_revoked(sender: Any, *args: Any, **_: Any) -> None:
        worker.forget_partitions(args[0])  # faust sends the revoked set positionally

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def on_shutdown(sender: Any, *_: Any, **__: Any) -> None:
        await worker.stop()

    return app, worker
