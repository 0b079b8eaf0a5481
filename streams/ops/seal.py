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


async def seal(
    kafka: KafkaSettings,
    store: ShardStore,
    timeout_s: float,
    on_lag: Callable[[int], None] = lambda lag: None,
) -> SealedManifest:
    info = store.manifest()
    if info is None:
        raise CliError(f"no dataset version at {store.url} (no dataset.json)")
    group = str(info.get("consumer_group") or kafka.group(f"draftgen-tokenize-{info['dataset']}"))
    committed = await wait_caught_up(kafka, group, timeout_s, on_lag=on_lag)
    return await asyncio.to_thread(store.seal, committed)
