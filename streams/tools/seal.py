"""Sealing a dataset version: wait until its consumer group has caught up with `completions`,
then write the one manifest that lists exactly its shards and rows (sinks/manifest.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiokafka.admin import AIOKafkaAdminClient

from sinks.manifest import SealedManifest
from sinks.shards import ShardStore
from streams.core.errors import CliError
from streams.core.settings import COMPLETIONS, KafkaSettings
from streams.core.settings.names import tokenize_group_name
from streams.core.topic_reader import TopicReader


async def group_offsets(
    kafka: KafkaSettings, group: str, topic: str
) -> tuple[dict[int, int], dict[int, int]]:
    """(the group's committed offsets, the topic's end offsets) per partition, now."""
    reader = TopicReader(kafka, topic)
    try:
        ends = {tp.partition: end for tp, end in reader.ends_at_open.items()}
        if await reader.open():
            ends = {tp.partition: end for tp, end in reader.ends_at_open.items()}
    finally:
        await reader.close()
    admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    committed = {
        tp.partition: meta.offset
        for tp, meta in offsets.items()
        if tp.topic == topic and meta.offset >= 0
    }
    return committed, ends


async def wait_caught_up(
    kafka: KafkaSettings,
    group: str,
    timeout_s: float,
    poll_s: float = 2.0,
    on_lag: Callable[[int], None] = lambda lag: None,
) -> dict[int, int]:
    """Until `group` has committed every completion that existed when this was called; returns
    its committed offsets then (completions that arrive meanwhile may be included or not)."""
    topic = kafka.topic(COMPLETIONS)
    _, targets = await group_offsets(kafka, group, topic)
    deadline = time.monotonic() + timeout_s
    while True:
        committed, _ = await group_offsets(kafka, group, topic)
        lag = sum(max(0, end - committed.get(p, 0)) for p, end in targets.items())
        if lag == 0:
            return committed
        if time.monotonic() > deadline:
            raise CliError(
                f"not caught up after {timeout_s:.0f}s: group {group} has {lag} completions "
                "to commit; is a tokenize worker or a replay running for this version?"
            )
        on_lag(lag)
        await asyncio.sleep(poll_s)  # a remote group's progress: nothing to await but time


# how long the committed offsets must stay put after the fence: longer than a worker's commit
# interval (0.25 s), so a window acked just before a worker saw the fence is sealed too
SETTLE_S = 2.0


async def wait_for_version(
    store: ShardStore, timeout_s: float, poll_s: float = 1.0
) -> dict[str, object]:
    """The version's dataset.json, once a worker (or a replay just started) has written it."""
    deadline = time.monotonic() + timeout_s
    while (info := await asyncio.to_thread(store.manifest)) is None:
        if time.monotonic() > deadline:
            raise CliError(
                f"no dataset version at {store.url} after {timeout_s:.0f}s (no dataset.json): "
                "is its tokenize worker or replay running?"
            )
        await asyncio.sleep(poll_s)  # a worker on another machine: nothing to await but time
    return info


async def settled_offsets(
    kafka: KafkaSettings, group: str, timeout_s: float, settle_s: float = SETTLE_S
) -> dict[int, int]:
    """The group's committed offsets once they have not moved for `settle_s`. Still moving at
    `timeout_s`: a writer that does not honour the fence commits to the group, and no offsets
    are safe to seal at (CliError; the fence stays, so sealing again after stopping it works)."""
    topic = kafka.topic(COMPLETIONS)
    deadline = time.monotonic() + timeout_s
    committed, _ = await group_offsets(kafka, group, topic)
    while True:
        await asyncio.sleep(settle_s)  # a remote group's commits: nothing to await but time
        again, _ = await group_offsets(kafka, group, topic)
        if again == committed:
            return again
        if time.monotonic() > deadline:
            raise CliError(
                f"group {group} still commits after the fence ({timeout_s:.0f}s): a worker "
                "that does not check it (an older draftgen?) writes to this version; stop it "
                "and seal again"
            )
        committed = again


async def seal(
    kafka: KafkaSettings,
    store: ShardStore,
    timeout_s: float,
    on_lag: Callable[[int], None] = lambda lag: None,
    settle_s: float = SETTLE_S,
) -> SealedManifest:
    """Wait for the version to exist and to catch up, fence it (its workers commit nothing
    more, sinks/sink.py), then seal it at the offsets committed once they stopped moving."""
    started = time.monotonic()
    info = await wait_for_version(store, timeout_s)
    group = str(
        info.get("consumer_group") or kafka.group(tokenize_group_name(str(info["dataset"])))
    )
    if not await asyncio.to_thread(store.fenced):
        remaining = max(timeout_s - (time.monotonic() - started), 1.0)
        await wait_caught_up(kafka, group, remaining, on_lag=on_lag)
        await asyncio.to_thread(store.write_fence)
    # fenced already: an earlier seal stopped after its fence; its workers have stopped
    committed = await settled_offsets(kafka, group, timeout_s, settle_s)
    return await asyncio.to_thread(store.seal, committed)
