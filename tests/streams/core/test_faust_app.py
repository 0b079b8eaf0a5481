"""faust's datadir: under the temporary directory the worker was given, removed when it stops."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from pathlib import Path
from typing import Any

import pytest
from faust.worker import Worker

from streams.core import faust_app
from streams.core.faust_app import create_app, run_worker
from streams.core.outage import RepeatFilter
from streams.core.settings import KafkaSettings

KAFKA = KafkaSettings(bootstrap="127.0.0.1:9")  # never connected to


@pytest.fixture
def tmp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What TMPDIR names (tempfile reads it once per process, so its cached value is set)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("ending", [SystemExit(0), KeyboardInterrupt(), RuntimeError("boom")])
def test_the_datadir_is_under_tmpdir_and_removed_when_the_worker_stops(
    tmp_root: Path, monkeypatch: pytest.MonkeyPatch, ending: BaseException
) -> None:
    app = create_app("datadir-test", KAFKA, prefetch=4)
    datadir = Path(app.conf.datadir)
    assert datadir.parent == tmp_root and datadir.is_dir()
    (datadir / "v1").mkdir()  # what faust puts there

    def execute(self: Worker) -> None:  # the worker's run, ending as a stopped worker's does
        assert datadir.is_dir()
        raise ending

    monkeypatch.setattr(Worker, "execute_from_commandline", execute)
    with pytest.raises(type(ending)):
        run_worker(app)
    assert not datadir.exists()
    assert list(tmp_root.iterdir()) == []


def test_the_workers_log_handlers_get_the_repeat_filter(
    tmp_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mode replaces the root handlers as the worker starts; the ones it puts there quiet a
    client's repeated reconnect lines (streams/core/outage.py) through mode's public signal."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    seen: list[bool] = []

    def execute(self: Worker) -> None:  # the worker's first start, then a stop
        asyncio.run(self.on_first_start())
        for handler in logging.getLogger().handlers:
            seen.append(any(isinstance(f, RepeatFilter) for f in handler.filters))
        raise SystemExit(0)

    monkeypatch.setattr(Worker, "execute_from_commandline", execute)
    try:
        with pytest.raises(SystemExit):
            run_worker(create_app("logging-test", KAFKA, prefetch=4))
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    assert seen and all(seen)


def test_a_send_waited_for_with_a_timeout_leaves_the_producers_future_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # faust's done-callback on that future logs a cancellation as a traceback (an outage
    # would print one per heartbeat); the record is still delivered once the broker is back
    deliveries: list[asyncio.Future[None]] = []

    class Topic:
        async def send(self, key: bytes, value: bytes) -> asyncio.Future[None]:
            deliveries.append(asyncio.get_running_loop().create_future())
            return deliveries[-1]

    monkeypatch.setattr(faust_app, "raw_topic", lambda app, name: Topic())

    async def scenario() -> None:
        send = faust_app.kafka_sender(create_app("sender-test", KAFKA, prefetch=4))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(send("t", b"k", b"v"), 0.01)
        assert not deliveries[0].cancelled()
        deliveries[0].set_result(None)  # acknowledged later: nothing left to go wrong

    asyncio.run(scenario())


async def _commit_emptied_by_a_rebalance(thread_class: type | None) -> tuple[bool, list[object]]:
    """faust's commit of partition 0, with the rebalance that takes partition 0 landing at its
    one await (the producer's flush), as it does in a loaded group. No broker: the aiokafka
    consumer is never started; its subscription is set as the group coordinator sets it."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition
    from faust.types import TP

    app = create_app("commit-race-test", KAFKA, prefetch=4)
    consumer: Any = app.consumer  # faust's aiokafka driver's, not its abstract type's
    thread = consumer._thread
    if thread_class is not None:
        thread.__class__ = thread_class
    kafka = AIOKafkaConsumer("t", bootstrap_servers="127.0.0.1:9", group_id="g")
    kafka._subscription.assign_from_subscribed({TopicPartition("t", 0), TopicPartition("t", 1)})
    thread._consumer = kafka
    crashes: list[object] = []

    async def crash(reason: BaseException) -> None:
        crashes.append(reason)

    async def flush() -> None:  # the rebalance completes meanwhile: partition 0 is gone
        kafka._subscription.assign_from_subscribed({TopicPartition("t", 1)})

    thread.crash = crash
    thread.commit = thread._commit  # in the thread's loop in a worker; the same code path
    app.producer.flush = flush
    try:
        return await consumer._commit_offsets({TP("t", 0): 5}), crashes
    finally:
        await kafka.stop()


def test_a_commit_a_rebalance_emptied_is_skipped_not_a_crash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer: Any = create_app("commit-race-wiring", KAFKA, prefetch=4).consumer
    assert isinstance(consumer._thread, faust_app._RebalanceSafeCommits)

    with caplog.at_level(logging.INFO):
        committed, crashes = asyncio.run(_commit_emptied_by_a_rebalance(None))
    assert (committed, crashes) == (False, [])
    assert any("skipped after a rebalance" in r.getMessage() for r in caplog.records)


def test_stock_faust_still_crashes_on_that_commit() -> None:
    # the canary: once faust skips the empty commit itself, _RebalanceSafeCommits can go
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    committed, crashes = asyncio.run(_commit_emptied_by_a_rebalance(AIOKafkaConsumerThread))
    assert committed is False
    assert len(crashes) == 1 and isinstance(crashes[0], ValueError), crashes
