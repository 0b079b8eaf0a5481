"""Many tokenize and replay workers per dataset version, joining and leaving mid-run (kill -9,
SIGTERM and restart): exactly one outcome per prompt, no overlapping windows, the same rows as
one worker; the latest answer of a prompt wins; a crash between a dead letter and its marker
leaves one recorded drop."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from compose.process import ManagedProcess
from compose.tiny_tokenizers import QWEN36_CHAT_TEMPLATE
from sinks.reader import DatasetReader
from sinks.shards import ShardStore
from streams.core.faults import AFTER_DEAD_LETTERS
from streams.core.records import CompletionRecord
from streams.core.settings import COMPLETIONS, KafkaSettings
from streams.core.topics import ensure_topics
from streams.observe.heartbeat import Heartbeat, HeartbeatReader
from streams.tools.progress import dataset_figures
from tests.faults import Crash
from tests.polling import wait_for

pytestmark = pytest.mark.integration

COUNT = 2000
# every 25th answer was cut by max tokens: the sample policy drops it (a recorded drop)
CUT_EVERY = 25


def completion(index: int, answer: str = "") -> CompletionRecord:
    return CompletionRecord(
        prompt_id=f"p{index:05d}",
        messages=[{"role": "user", "content": f"Question {index}: what is {index} squared?"}],
        source="synthetic",
        reasoning_content=f"{index} times {index} is {index * index}.",
        content=answer or f"It is {index * index}.",
        finish_reason="length" if index % CUT_EVERY == 0 else "stop",
    )


async def _produce(kafka: KafkaSettings, records: Iterable[CompletionRecord]) -> None:
    await ensure_topics(kafka)
    producer = AIOKafkaProducer(**kafka.aiokafka_kwargs(), linger_ms=20)
    await producer.start()
    try:
        sends = [
            await producer.send(kafka.topic(COMPLETIONS), r.encode(), key=r.prompt_id.encode())
            for r in records
        ]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


def produce(kafka: KafkaSettings, records: Iterable[CompletionRecord]) -> None:
    asyncio.run(_produce(kafka, records))


def replay(pipeline: Any, dataset: str, name: str, *extra: str) -> ManagedProcess:
    argv = ["--log-level", "INFO", "replay", "--tokenizer-dir", str(pipeline.tokenizer_dir)]
    argv += ["--out", pipeline.out, "--dataset", dataset, "--idle-flush", "1"]
    argv += ["--shard-records", "50", "--follow", *pipeline.common, *extra]
    return pipeline.stack.start_worker(name, argv, env=pipeline.env)


def seal(pipeline: Any, dataset: str, timeout: float = 240) -> str:
    """`draftgen seal`: returns once the version has caught up with every completion."""
    store = pipeline.store(dataset)
    wait_for(lambda: store.manifest() is not None, 120, f"a worker to start {dataset}")
    done = pipeline.draftgen(
        *("seal", "--out", pipeline.out, "--dataset", dataset, *pipeline.common),
        *("--timeout", str(timeout)),
        timeout=timeout + 60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def committed_samples(store: ShardStore) -> int:
    return dataset_figures(store).samples


def rows_by_prompt(store: ShardStore) -> dict[str, dict[str, Any]]:
    table = DatasetReader(store).table()
    ids = table["prompt_id"].to_pylist()
    assert len(ids) == len(set(ids)), "a prompt id twice in the version"
    return {row["prompt_id"]: row for row in table.to_pylist()}


def assert_one_outcome_each(store: ShardStore, expected: int) -> dict[str, dict[str, Any]]:
    sealed = store.sealed()
    assert sealed is not None
    rows = rows_by_prompt(store)
    dropped = set(sealed.dropped)
    assert not dropped & set(rows), "a prompt both a sample and a recorded drop"
    assert len(rows) + len(dropped) == expected
    assert dropped == {f"p{i:05d}" for i in range(0, expected, CUT_EVERY)}
    assert set(sealed.drops) == {"policy_length"}
    # the windows of the version never overlap: each offset counted once
    by_partition: dict[int, list[tuple[int, int]]] = {}
    for window in store.committed(sealed_offsets(sealed)).windows:
        by_partition.setdefault(window.partition, []).append(
            (window.start_offset, window.end_offset)
        )
    for ranges in by_partition.values():
        ranges.sort()
        for (_, end), (start, _) in itertools.pairwise(ranges):
            assert end < start, f"overlapping windows {ranges}"
    return rows


def sealed_offsets(sealed: Any) -> dict[int, int]:
    return {int(p): o for p, o in sealed.offsets.items()}


def churn(workers: list[ManagedProcess], store: ShardStore, stack: Any) -> None:
    """Mid-run: one worker killed with -9, another stopped (SIGTERM) and started again."""
    wait_for(lambda: committed_samples(store) >= COUNT // 5, 180, "a fifth of the samples")
    workers[0].kill()
    wait_for(lambda: committed_samples(store) >= COUNT // 2, 180, "half of the samples")
    workers[1] = stack.restart(workers[1])


@pytest.mark.parametrize("stage", ["tokenize", "replay"])
def test_many_workers_one_outcome_per_prompt(pipeline, stage: str, tmp_path) -> None:
    produce(pipeline.kafka, (completion(i) for i in range(COUNT)))
    extra: tuple[str, ...] = ()
    if stage == "replay":
        # a template change: a replay is what a team runs after fixing one
        template = QWEN36_CHAT_TEMPLATE.replace(
            "<|im_start|>assistant\\n", "<|im_start|>assistant \\n"
        )
        assert template != QWEN36_CHAT_TEMPLATE
        changed = tmp_path / "changed.jinja"
        changed.write_text(template)
        extra = ("--token-source", "rendered", "--chat-template", str(changed))
    start = (
        (lambda name: pipeline.tokenize(*extra, dataset="many", name=name))
        if stage == "tokenize"
        else (lambda name: replay(pipeline, "many", name, *extra))
    )
    workers = [start(f"{stage}-{i}") for i in range(3)]
    many = pipeline.store("many")
    churn(workers, many, pipeline.stack)
    seal(pipeline, "many")
    rows = assert_one_outcome_each(many, COUNT)

    # the same rows as one worker builds without interruption
    if stage == "tokenize":
        pipeline.tokenize(*extra, dataset="one", name="alone")
    else:
        replay(pipeline, "one", "alone", *extra)
    seal(pipeline, "one")
    alone = assert_one_outcome_each(pipeline.store("one"), COUNT)
    assert rows.keys() == alone.keys()
    for prompt_id, row in rows.items():
        assert row["input_ids"] == alone[prompt_id]["input_ids"], prompt_id
        assert row["loss_mask"] == alone[prompt_id]["loss_mask"], prompt_id


def test_latest_answer_wins_and_a_crash_before_the_marker_records_one_drop(pipeline) -> None:
    store = pipeline.store("v1")
    produce(pipeline.kafka, [completion(i) for i in range(1, 6)])
    # the worker dies at its first dead letter, after sending it and before the window's marker
    crashing = pipeline.tokenize(dataset="v1", crash=Crash(AFTER_DEAD_LETTERS, 1))
    wait_for(lambda: "p00001" in dataset_figures(store).prompt_ids, 120, "p00001 committed")
    # p00001 answered again (regenerated) after its first answer was committed; p00025 is
    # dropped by the policy
    regenerated_answer = "A better, regenerated answer."
    produce(pipeline.kafka, [completion(1, answer=regenerated_answer), completion(25)])
    wait_for(lambda: not crashing.alive(), 120, "the worker to die after the dead letter")
    pipeline.tokenize(dataset="v1", name="again")
    seal(pipeline, "v1")

    rows = rows_by_prompt(store)
    assert set(rows) == {f"p{i:05d}" for i in range(1, 6)}
    regenerated = _rendered_ids(pipeline, completion(1, answer=regenerated_answer))
    assert rows["p00001"]["input_ids"] == regenerated
    assert regenerated != _rendered_ids(pipeline, completion(1))
    letters = [x for x in pipeline.dead_letters() if x.prompt_id == "p00025"]
    assert len(letters) == 2, "the crash came after the dead letter: it was sent twice"
    sealed = store.sealed()
    assert sealed is not None and sealed.dropped == {"p00025": "policy_length"}
    assert sealed.replaced == 1 and sealed.samples == 5

    # a replay built after the regeneration holds the new answer only
    replay(pipeline, "v2", "replay", "--token-source", "rendered")
    seal(pipeline, "v2")
    replayed = rows_by_prompt(pipeline.store("v2"))
    assert replayed["p00001"]["input_ids"] == regenerated
    assert set(replayed) == set(rows)


def _rendered_ids(pipeline: Any, record: CompletionRecord) -> list[int]:
    from streams.core.tokenizers import load_tokenizer
    from streams.tokenize.samples import SampleBuilder

    loaded = load_tokenizer(pipeline.tokenizer_dir)
    builder = SampleBuilder(loaded.tokenizer, loaded.profile, prefer="rendered")
    sample = builder.build(record)
    return list(sample.input_ids)


def test_memory_stays_within_the_budget_whatever_the_backlog(pipeline) -> None:
    """A replay of a backlog ten times the open-window budget: the worker's peak stays within
    the budget plus one record, and every completion still ends once."""
    records = [completion(i, answer="word " * 200) for i in range(1, 400)]
    size = max(len(r.encode()) for r in records)
    budget = 40 * size
    assert sum(len(r.encode()) for r in records) > 9 * budget
    produce(pipeline.kafka, records)
    replay(
        pipeline,
        "small",
        "replay",
        *("--max-open-bytes", str(budget), "--shard-records", "2000", "--heartbeat-interval", "1"),
    )

    def peak() -> float | None:
        async def read() -> list[Heartbeat]:
            reader = HeartbeatReader(pipeline.kafka)
            try:
                return list((await reader.poll()).values())
            finally:
                await reader.close()

        gauges = [b.gauges for b in asyncio.run(read()) if b.label == "small"]
        return gauges[0].get("peak_open_bytes") if gauges else None

    seal(pipeline, "small")
    wait_for(lambda: (peak() or 0) > 0, 60, "a heartbeat with the peak")
    assert (peak() or 0) <= budget + 2 * size  # a record counts its bytes and decoded form
    rows = rows_by_prompt(pipeline.store("small"))
    assert len(rows) + len(pipeline.store("small").sealed().dropped) == len(records)


@pytest.mark.parametrize("workers", [1, 2])
def test_replay_shows_its_progress_and_ends_once_caught_up(
    pipeline, workers: int, tmp_path
) -> None:
    """Without --follow a replay ends by itself once its version holds every completion stored
    when it started, with plain progress lines (no escape codes) when not on a terminal."""
    ids = {f"p{i:05d}" for i in range(1, 121) if i % CUT_EVERY}  # none cut off: no drops
    produce(pipeline.kafka, (completion(int(i[1:])) for i in sorted(ids)))
    done = pipeline.draftgen(
        "replay",
        *("--tokenizer-dir", str(pipeline.tokenizer_dir), "--out", pipeline.out),
        *("--dataset", "ends", "--idle-flush", "1", "--workers", str(workers)),
        *("--workdir", str(tmp_path / "replay"), *pipeline.common),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stderr and "\r" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    expected = f"draftgen replay: caught up: {len(ids)} completions read, {len(ids)} samples"
    assert last.startswith(expected), last
    assert set(rows_by_prompt(pipeline.store("ends"))) == ids
