"""`draftgen status`: where a run stands, from Kafka (offsets, groups, dead letters, worker
heartbeats) and from the shard markers of each dataset version. Read-only: it joins no group.

`--watch` keeps its clients open and reads the dead-letters and worker-stats topics
incrementally, so a refresh costs a few offset requests plus a read of the markers.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from dataclasses import replace

import fsspec
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from sinks.shards import ShardStore
from streams.core.errors import CliError
from streams.core.settings import (
    COMPLETIONS,
    GENERATE_GROUP,
    PROMPTS,
    StatusSettings,
    StorageSettings,
)
from streams.core.settings.names import TOKENIZE_GROUP_PREFIX, tokenize_group_name
from streams.core.topics import group_names
from streams.observe.heartbeat import HeartbeatReader
from streams.tools.progress import DeadLetterReader, dataset_figures
from streams.tools.status_render import render_text, to_json
from streams.tools.status_view import (
    DatasetRow,
    GroupLag,
    StatusSnapshot,
    estimate,
    finish_rate,
    group_lag,
    server_rows,
    tokenizer_rows,
)

# the drift causes a dataset row of `status --json` lists, most frequent first
STATUS_CAUSES = 5


def find_datasets(storage: StorageSettings) -> list[str]:
    """Dataset versions under --out: directories holding a dataset.json (written by every
    tokenize worker before its first shard)."""
    fs, root = fsspec.core.url_to_fs(storage.out, **storage.storage_options())
    try:
        manifests = fs.glob(f"{root.rstrip('/')}/*/dataset.json")
    except FileNotFoundError:
        return []
    return sorted({str(path).rstrip("/").split("/")[-2] for path in manifests})


class StatusProbe:
    """Kafka clients kept open across refreshes."""

    def __init__(self, settings: StatusSettings):
        self.settings = settings
        self.kafka = settings.kafka
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._dead = DeadLetterReader(self.kafka)
        self._beats = HeartbeatReader(self.kafka)
        self._previous: tuple[float, int] | None = None  # (time, prompts finished) for --watch

    async def start(self) -> None:
        self._admin = AIOKafkaAdminClient(**self.kafka.aiokafka_kwargs())
        await self._admin.start()
        self._consumer = AIOKafkaConsumer(
            **self.kafka.aiokafka_kwargs(), group_id=None, enable_auto_commit=False
        )
        await self._consumer.start()

    async def close(self) -> None:
        await self._dead.close()
        await self._beats.close()
        if self._consumer is not None:
            await self._consumer.stop()
        if self._admin is not None:
            await self._admin.close()

    # -- one refresh ---------------------------------------------------------------------------

    async def snapshot(self) -> StatusSnapshot:
        assert self._consumer is not None and self._admin is not None, "start() first"
        partitions = await self._partitions([PROMPTS, COMPLETIONS])
        offsets = {name: await self._offsets(name, partitions[name]) for name in partitions}
        tally = await self._dead.poll()
        beats = await self._beats.poll()
        now = time.time()
        servers = server_rows(beats.values(), now)
        groups = await self._groups(offsets)
        datasets = await asyncio.to_thread(self._datasets)
        sealed = await asyncio.to_thread(self._sealed_groups)
        groups = [replace(g, sealed=g.group in sealed) for g in groups]

        published = sum(offsets[PROMPTS][1].values())
        completions = sum(offsets[COMPLETIONS][1].values())
        generate = next((g for g in groups if g.group == self.kafka.group(GENERATE_GROUP)), None)
        generate_dead = sum(n for (stage, _), n in tally.by_reason.items() if stage == "generate")
        return StatusSnapshot(
            time=now,
            bootstrap=self.kafka.bootstrap,
            topic_prefix=self.kafka.topic_prefix,
            published=published,
            completions=completions,
            out=self.settings.storage.out if self.settings.storage else None,
            datasets=datasets,
            dead_letters=dict(tally.by_reason),
            groups=groups,
            servers=servers,
            tokenizers=tokenizer_rows(beats.values(), now),
            eta=estimate(
                generate.lag if generate else None,
                finish_rate(servers),
                self._offsets_rate(now, completions + generate_dead),
            ),
        )

    def _offsets_rate(self, now: float, finished: int) -> float | None:
        """Prompts finished per second between two refreshes (only --watch has two)."""
        previous, self._previous = self._previous, (now, finished)
        if previous is None or now <= previous[0]:
            return None
        return max(0, finished - previous[1]) / (now - previous[0])

    async def _partitions(self, names: list[str]) -> dict[str, list[int]]:
        """Partition ids of pipeline topics (none for a topic not created yet)."""
        assert self._admin is not None
        # only topics that exist: describing a missing one asks a permissive broker to create it
        existing = set(await self._admin.list_topics())
        wanted = [self.kafka.topic(n) for n in names if self.kafka.topic(n) in existing]
        described = await self._admin.describe_topics(wanted) if wanted else []
        found = {
            topic["topic"]: sorted(p["partition"] for p in topic.get("partitions") or [])
            for topic in described
            if not topic.get("error_code")
        }
        return {name: found.get(self.kafka.topic(name), []) for name in names}

    async def _offsets(self, name: str, ids: list[int]) -> tuple[dict[int, int], dict[int, int]]:
        """(beginning, end) offsets per partition of one pipeline topic; empty if missing."""
        assert self._consumer is not None
        topic = self.kafka.topic(name)
        partitions = [TopicPartition(topic, p) for p in ids]
        if not partitions:
            return {}, {}
        beginning = await self._consumer.beginning_offsets(partitions)
        end = await self._consumer.end_offsets(partitions)
        return (
            {tp.partition: offset for tp, offset in beginning.items()},
            {tp.partition: offset for tp, offset in end.items()},
        )

    async def _groups(
        self, offsets: dict[str, tuple[dict[int, int], dict[int, int]]]
    ) -> list[GroupLag]:
        """Every group of this pipeline (by name prefix), plus the ones status expects even if
        they have not committed yet: the generate group and the asked datasets' groups."""
        assert self._admin is not None
        ours = self.kafka.group("draftgen-")
        listed = group_names(await self._admin.list_consumer_groups())
        names = {name for name in listed if name.startswith(ours)}
        names.add(self.kafka.group(GENERATE_GROUP))
        names.update(self._dataset_group(d) for d in self.settings.datasets)
        lags = []
        for name in sorted(names):
            committed = await self._admin.list_consumer_group_offsets(name)
            for short in self._topics_of(name, committed):
                beginning, end = offsets[short]
                topic = self.kafka.topic(short)
                positions = {
                    tp.partition: meta.offset for tp, meta in committed.items() if tp.topic == topic
                }
                lags.append(group_lag(name, short, positions, beginning, end))
        return lags

    def _dataset_group(self, dataset: str) -> str:
        """A version's tokenize group: the one its manifest names (`run` gives each new version
        a group of its own), else the one named after the version."""
        group = None
        if self.settings.storage is not None:
            storage = self.settings.storage
            manifest = ShardStore(storage.out, dataset, storage.storage_options()).manifest()
            group = (manifest or {}).get("consumer_group")
        return str(group) if group else self.kafka.group(tokenize_group_name(dataset))

    def _topics_of(self, group: str, committed: dict[TopicPartition, object]) -> list[str]:
        """Which of the pipeline's input topics a group reads: by its name, or by its commits
        (a group named otherwise, e.g. a replay, shows up once it has committed)."""
        wanted = {self.kafka.topic(t): t for t in (PROMPTS, COMPLETIONS)}
        topics = {wanted[tp.topic] for tp in committed if tp.topic in wanted}
        if group == self.kafka.group(GENERATE_GROUP):
            topics.add(PROMPTS)
        elif group.startswith(self.kafka.group(TOKENIZE_GROUP_PREFIX)):
            topics.add(COMPLETIONS)
        return sorted(topics, key=[PROMPTS, COMPLETIONS].index)

    def _sealed_groups(self) -> set[str]:
        """The tokenize groups of the sealed versions under --out."""
        storage = self.settings.storage
        if storage is None:
            return set()
        groups = set()
        for name in find_datasets(storage):
            if ShardStore(storage.out, name, storage.storage_options()).sealed() is not None:
                groups.add(self._dataset_group(name))
        return groups

    def _datasets(self) -> list[DatasetRow]:
        storage = self.settings.storage
        if storage is None:
            return []
        names = list(self.settings.datasets) or find_datasets(storage)
        rows = []
        for name in names:
            figures = dataset_figures(
                ShardStore(storage.out, name, storage.storage_options()), keep_ids=False
            )
            rows.append(
                DatasetRow(
                    dataset=name,
                    samples=figures.samples,
                    tokens=figures.tokens,
                    loss_tokens=figures.loss_tokens,
                    shards=figures.shards,
                    duplicates=figures.replaced,
                    drops=dict(sorted(Counter(figures.drops.values()).items())),
                    compared=figures.compared,
                    drifted=figures.drifted,
                    drift_causes=dict(figures.drift_causes.most_common(STATUS_CAUSES)),
                    normalizations=dict(figures.normalizations),
                )
            )
        return rows


# -- the command ---------------------------------------------------------------------------------


def emit(snapshot: StatusSnapshot, settings: StatusSettings, first: bool) -> None:
    if settings.as_json:
        option = orjson.OPT_INDENT_2 if settings.watch_s is None else 0
        sys.stdout.write(orjson.dumps(to_json(snapshot), option=option).decode() + "\n")
    else:
        text = render_text(snapshot)
        if settings.watch_s is not None and sys.stdout.isatty():
            text = "\x1b[H\x1b[2J" + text  # redraw in place
        elif not first:
            text = "\n" + text
        sys.stdout.write(text + "\n")
    sys.stdout.flush()


async def watch(settings: StatusSettings) -> None:
    probe = StatusProbe(settings)
    await probe.start()
    try:
        first = True
        while True:
            emit(await probe.snapshot(), settings, first)
            first = False
            if settings.watch_s is None:
                return
            await asyncio.sleep(settings.watch_s)
    finally:
        await probe.close()


def run_status(settings: StatusSettings) -> int:
    kafka = settings.kafka
    try:
        asyncio.run(watch(settings))
    except KeyboardInterrupt:
        if settings.watch_s is None:
            raise
    except KafkaError as err:
        raise CliError(f"cannot read Kafka at {kafka.bootstrap}: {err}") from None
    return 0
