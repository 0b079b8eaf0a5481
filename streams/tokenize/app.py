"""`draftgen worker tokenize` / `draftgen replay`: the Faust app around the tokenize stage and
its shard sink."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Any

import faust
import orjson

from sinks.shards import ShardStore, rows_to_table
from streams.core.crash_guard import CrashGuard
from streams.core.faust_app import consume, create_app, guard_commits, kafka_sender, raw_topic
from streams.core.group_starts import GroupStarts
from streams.core.outage import Outage
from streams.core.retry import backoff
from streams.core.settings import COMPLETIONS, DEAD_LETTERS, ObserveSettings, TokenizeSettings
from streams.core.tokenizers import LoadedTokenizer
from streams.observe.app import install
from streams.observe.figures import declared, read_figures
from streams.observe.metrics import TokenizeMetrics
from streams.tokenize.policies import PolicySampleBuilder
from streams.tokenize.stage import TokenizeStage
from streams.tokenize.stats import TokenizeStats

log = logging.getLogger(__name__)


def observe_tokenize(
    app: faust.App, worker: TokenizeStage, metrics: TokenizeMetrics, settings: ObserveSettings
) -> str | None:
    metrics.attach(lambda: read_figures(worker.stats))
    return install(app, worker.settings.kafka, metrics, settings, Outage("broker", log))


def manifest(settings: TokenizeSettings, loaded: LoadedTokenizer) -> dict[str, Any]:
    return {
        "dataset": settings.dataset,
        "tokenizer_dir": str(loaded.directory),
        **loaded.hashes(),
        "chat_template_file": settings.chat_template_file,
        "family": loaded.profile.name,
        "token_source": settings.token_source,
        "consumer_group": settings.consumer_group,
        "shard_max_records": settings.shard_max_records,
        "shard_max_tokens": settings.shard_max_tokens,
        "measure_drift": settings.measure_drift,
        "policy": settings.policy.model_dump(),
        "created_at": time.time(),
    }


def held_prompts(settings: TokenizeSettings) -> frozenset[str] | None:
    """The prompt ids the version holds (`prompts_file`); None: every completion."""
    if settings.prompts_file is None:
        return None
    with open(settings.prompts_file, "rb") as file:
        return frozenset(orjson.loads(file.read()))


def stop_sealed(line: str) -> None:
    """The version was sealed under this worker: say so, and stop as on SIGTERM (nothing
    more is acked; `worker.sink.sealed` tells the command line to exit non-zero)."""
    log.error("%s", line)
    asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)


def build_tokenize_app(
    settings: TokenizeSettings,
    loaded: LoadedTokenizer,
    store: ShardStore,
    observe: ObserveSettings | None = None,
) -> tuple[faust.App, TokenizeStage]:
    kafka = settings.kafka
    observe = observe or ObserveSettings()
    guard = CrashGuard(observe.state_dir, settings.consumer_group)
    app = create_app(
        settings.consumer_group,
        kafka,
        prefetch=min(settings.shard_max_records, 1024),
        offset_reset="earliest" if settings.from_beginning else "latest",
    )
    worker = TokenizeStage(
        settings,
        PolicySampleBuilder(
            loaded.tokenizer,
            loaded.profile,
            prefer=settings.token_source,
            measure_drift=settings.measure_drift,
            encode_turns=settings.encode_turns,
            policy=settings.policy,
            encoder=settings.encoder,
        ),
        store,
        kafka_sender(app),
        dead_letters_topic=kafka.topic(DEAD_LETTERS),
        # the fencing token of the shards this worker writes (sinks/sink.py)
        epoch=lambda: int(app.consumer_generation_id),
        guard=guard,
        on_sealed=stop_sealed,
        prompts=held_prompts(settings),
        tokenized_with=loaded.hashes(),
    )
    observe_tokenize(
        app, worker, TokenizeMetrics(settings.dataset, declared(TokenizeStats)), observe
    )

    @app.agent(raw_topic(app, kafka.topic(COMPLETIONS)), name="tokenize")
    async def tokenize(stream: Any) -> None:
        if settings.measure_drift or settings.token_source == "rendered":
            # the agent starts before the group is joined: build the encoder's tiktoken twin
            # and check it against the tokenizer meanwhile (~3 s for Qwen's vocabulary)
            # (idempotent; the first batch waits for it if it is not done)
            asyncio.get_running_loop().run_in_executor(None, worker.builder.encoder.prepare)
        # pyarrow imports pandas at its first array from a list (~2 s of CPU): paid while the
        # group is joined, not inside the first window's write
        asyncio.get_running_loop().run_in_executor(None, rows_to_table, [])
        # Acks are ours: a window's events are acked after its shard and marker are written.
        await consume(stream, guard, worker.sink.add)

    @app.timer(interval=1.0)
    async def flush_idle() -> None:
        await worker.sink.flush_idle()

    # the partitions' leases (streams/core/leases.py): where each resumes, a seek back over a
    # record not delivered, and the commit guard in faust's consumer thread
    starts = GroupStarts(
        kafka, settings.consumer_group, earliest=settings.from_beginning, backoff=backoff("outage")
    )

    async def seek(tp: Any, offset: int) -> None:
        await app.consumer.seek(tp, offset)

    worker.sink.leases.connect(starts.start_of, seek, starts.first_at)
    guard_commits(app, worker.sink.leases)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # faust types are narrower than its runtime
    async def on_revoked(sender: Any, *args: Any, **_: Any) -> None:
        worker.sink.on_revoked(args[0])  # faust sends the revoked set positionally

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(sender: Any, *args: Any, **_: Any) -> None:
        # a lease begun since the revocation, on a partition this assignment did not give us
        worker.sink.on_revoked(worker.sink.leases.not_in(args[0]))

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def on_shutdown(sender: Any, *_: Any, **__: Any) -> None:
        await starts.close()

    return app, worker
