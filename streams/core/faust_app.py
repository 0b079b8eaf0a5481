"""The one place a Faust app is configured: at-least-once, raw bytes, topics created by us."""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

from streams.core.checkpoint import Checkpoint
from streams.core.crash_guard import CrashGuard
from streams.core.leases import Leases
from streams.core.outage import quiet_repeats
from streams.core.settings import KafkaSettings


def _credentials(kafka: KafkaSettings) -> faust.types.auth.CredentialsT | None:
    if kafka.sasl_mechanism:
        return faust.SASLCredentials(
            username=kafka.sasl_username,
            password=kafka.sasl_secret(),
            mechanism=kafka.sasl_mechanism,
            ssl_context=kafka.ssl_context(),
        )
    context = kafka.ssl_context()
    return faust.SSLCredentials(context) if context is not None else None


class _IdempotentProducer(faust_aiokafka.Producer):
    """faust's aiokafka producer, always idempotent. With acks=all a write retried after a
    broker is lost (or a leader moves) is stored once, in order.

    One of two private faust hooks this project keeps (the other: `_RebalanceSafeCommits`):
    faust has no public setting for it (`producer_acks` sets acks; idempotence comes only
    with processing_guarantee=exactly_once, which also makes every send transactional, and
    the pipeline commits its own offsets), so the producer's extra options are extended here,
    as faust itself does inside a transaction.
    tests/streams/core/test_replication.py fails if faust stops calling this hook."""

    def _settings_extra(self) -> Mapping[str, Any]:
        return {**super()._settings_extra(), "acks": "all", "enable_idempotence": True}


class _RebalanceSafeCommits(faust_aiokafka.AIOKafkaConsumerThread):
    """faust's consumer thread, committing what the commit protocol allows: a thin adapter
    over `Checkpoint.offsets` (streams/core/checkpoint.py, where the steps and the invariant
    are), called where faust's offsets would reach Kafka.

    What it works around: faust checks a commit's partitions against the assignment, awaits
    the producer's flush, then the thread filters them again; a rebalance that took all of
    them meanwhile leaves `{}`, which aiokafka refuses (`ValueError({})`) and faust treats as
    fatal: the worker exits (faust-streaming #94/#95). The checkpoint's check and faust's own
    filter run with no await between them, in the thread's loop, the only place the assignment
    changes. tests/streams/core/test_faust_app.py fails if faust stops calling this hook, or
    if stock faust no longer crashes (then the rebalance step can go)."""

    async def _commit(self, offsets: Mapping[Any, int]) -> bool:
        checkpoint = getattr(self.transport, "checkpoint", None) or Checkpoint(logger=self.log)
        allowed = checkpoint.offsets(offsets, self.assignment())
        if not allowed:
            return False  # as faust answers a commit refused because the group rebalanced
        return await super()._commit(allowed)


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _RebalanceSafeCommits(self, loop=self.loop, beacon=self.beacon)


class _Transport(faust_aiokafka.Transport):
    Producer: ClassVar[type[faust.types.ProducerT]] = _IdempotentProducer
    Consumer: ClassVar[type[faust.types.ConsumerT]] = _Consumer
    # the commit protocol's last step for the app's partition leases (`guard_commits`)
    checkpoint: Checkpoint | None = None


def guard_commits(app: faust.App, leases: Leases) -> None:
    """Commit the app's partitions only as far as `leases` allow (`_RebalanceSafeCommits`)."""
    transport = app.transport
    if not isinstance(transport, _Transport):
        raise TypeError("guard_commits needs an app made by create_app")
    transport.checkpoint = Checkpoint(leases)


def create_app(
    app_id: str,
    kafka: KafkaSettings,
    *,
    prefetch: int,
    instance_id: str | None = None,
    offset_reset: str = "earliest",
) -> faust.App:
    """A Faust app whose consumer group is `app_id` (one per stage / dataset version)."""
    app = faust.App(
        app_id,
        broker=[f"kafka://{host}" for host in kafka.bootstrap.split(",")],
        broker_credentials=_credentials(kafka),
        key_serializer="raw",
        value_serializer="raw",
        autodiscover=False,
        web_enabled=False,
        store="memory://",
        # faust creates it even with the memory store; removed when the worker stops
        # (run_worker), and under the run's workdir for workers of `draftgen run` (TMPDIR)
        datadir=tempfile.mkdtemp(prefix="draftgen-faust-"),
        # No leader topic, no auto-created topics: the pipeline's topics are created explicitly.
        topic_disable_leader=True,
        topic_allow_declare=False,
        consumer_auto_offset_reset=offset_reset,
        consumer_group_instance_id=instance_id,
        broker_max_poll_interval=kafka.max_poll_interval_s,
        broker_session_timeout=kafka.session_timeout_s,
        broker_rebalance_timeout=kafka.rebalance_timeout_s,
        broker_heartbeat_interval=kafka.heartbeat_interval_s,
        # A rebalance must not wait for generations that take minutes; a revoked partition's
        # in-flight requests are finished by their old owner under a claim that its new owner
        # waits for (streams/generate/once.py), or redone and the duplicate removed downstream.
        stream_wait_empty=False,
        stream_buffer_maxsize=prefetch,
        broker_max_poll_records=prefetch,
        producer_acks=-1,
        producer_max_request_size=kafka.max_message_bytes,
        producer_compression_type=kafka.compression_type,
        consumer_max_fetch_size=kafka.topic_max_message_bytes,
        # how soon an acked offset is committed: the end of a run is its last commit, and a
        # commit is one small request (faust sends none when nothing new was acked)
        broker_commit_interval=0.25,
        # faust creates no topic here (topic_allow_declare=False); should it ever, they are
        # replicated like ours (`ensure_topics` resolves the number for the cluster)
        topic_replication_factor=kafka.replication_factor or 1,
    )
    # every record the app writes (completions, dead letters, ledger, heartbeats) goes
    # through this transport's producer: acks=all and idempotent (`_IdempotentProducer`)
    app.transport = _Transport(app.conf.broker_consumer, app)
    return app


def raw_topic(app: faust.App, name: str) -> faust.TopicT:
    return app.topic(name, key_type=bytes, value_type=bytes)


def kafka_sender(app: faust.App) -> Callable[[str, bytes, bytes], Awaitable[None]]:
    """send(topic, key, value) that returns once Kafka acknowledged the write."""
    topics: dict[str, faust.TopicT] = {}

    async def send(topic: str, key: bytes, value: bytes) -> None:
        if topic not in topics:
            topics[topic] = raw_topic(app, topic)
        delivery = await topics[topic].send(key=key, value=value)
        # shielded: a caller that stops waiting (a timeout) must not cancel the producer's
        # future, whose done-callback in faust would log the cancellation as a traceback
        await asyncio.shield(delivery)

    return send


async def consume(stream: Any, guard: CrashGuard, handle: Callable[[Any], Awaitable[None]]) -> None:
    """Hand each event of the stream to `handle`; acks are ours (`noack`). An exception that
    escapes `handle` (the per-record nets turn every expected one into a dead letter) is noted
    in the crash record before it crashes the worker, so that a crash loop on one record ends
    (streams/core/crash_guard.py)."""
    async for event in stream.noack().events():
        try:
            await handle(event)
        except asyncio.CancelledError:
            raise
        except BaseException as err:
            tp = event.message.tp
            guard.crashed(tp.topic, tp.partition, event.message.offset, err)
            raise


def _dump_tasks() -> None:
    for task in asyncio.all_tasks():
        task.print_stack(limit=12, file=sys.stderr)
    sys.stderr.flush()


def run_worker(app: faust.App, loglevel: str = "WARNING") -> None:
    """Run the app until SIGTERM/SIGINT (blocks)."""
    from faust.worker import Worker

    @app.task
    async def _install_task_dump() -> None:
        # `kill -USR2 <pid>` prints every asyncio task's stack: where a stalled stage waits.
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, _dump_tasks)

    class QuietWorker(Worker):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if not self.stdout.isatty():
                # faust's start-up spinner writes cursor codes whatever its output is
                self.spinner = None

        def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
            # mode's signal after it replaced the root handlers: filter the new ones
            super().on_setup_root_logger(logger, level)
            quiet_repeats(logger)

    logging.getLogger("faust").setLevel(loglevel)
    try:
        QuietWorker(
            app, loglevel=loglevel, quiet=True, redirect_stdouts=False
        ).execute_from_commandline()
    finally:  # it ends with SystemExit, also on SIGTERM
        shutil.rmtree(app.conf.datadir, ignore_errors=True)
