"""`draftgen audit` on the real broker: prompts published, their outcomes written to the topics as
the workers write them (completions, a dead letter, a ledger mark, the turns of an every-turn
conversation), the generate group's offsets committed past them all, and one prompt left with
nothing: the audit lists that one, exits 1, and the command it prints puts it back in the prompts
topic, beyond the group's committed offset, where a generate worker takes it."""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.records_to_delete import RecordsToDelete
from aiokafka.structs import OffsetAndMetadata

from compose.stack import draftgen_argv
from producers.publish import publish
from producers.sources import parse_source_spec
from streams.cli.main import main
from streams.core.ledger import ledger_key, ledger_value, settings_hash
from streams.core.records import CompletionRecord, DeadLetter, PromptRecord
from streams.core.settings import (
    COMPLETIONS,
    DEAD_LETTERS,
    GENERATE_GROUP,
    GENERATED,
    PROMPTS,
    KafkaSettings,
)
from streams.core.topic_reader import TopicReader
from streams.core.turns import EVERY_TURN, turn_prompt_id
from streams.tools.progress import dataset_figures
from tests.polling import wait_for

pytestmark = pytest.mark.integration

ROWS = ["completed-1", "completed-2", "dead-1", "marked-1", "lost-1"]


def row(row_id: str, turns: int = 1) -> bytes:
    messages: list[dict[str, str]] = []
    for turn in range(turns):
        if turn:
            messages.append({"role": "assistant", "content": f"answer {turn}"})
        messages.append({"role": "user", "content": f"{row_id}: question {turn}"})
    return orjson.dumps({"id": row_id, "messages": messages}) + b"\n"


async def read_prompts(kafka: KafkaSettings) -> list[tuple[int, int, PromptRecord]]:
    """(partition, offset, record) of every prompt record."""
    reader = TopicReader(kafka, kafka.topic(PROMPTS))
    found: list[tuple[int, int, PromptRecord]] = []
    try:
        assert await reader.open()
        await reader.read_to_end(
            lambda r: found.append((r.partition, r.offset, PromptRecord.decode(r.value)))
        )
    finally:
        await reader.close()
    return found


async def write_outcomes(kafka: KafkaSettings, by_row: dict[str, PromptRecord]) -> None:
    """What generate workers write: completions, a dead letter, a ledger mark; a conversation
    regenerated turn by turn has completions under its turns' ids only."""
    producer = AIOKafkaProducer(**kafka.aiokafka_kwargs(), **kafka.producer_kwargs())
    await producer.start()

    async def send(topic: str, key: str, value: bytes) -> None:
        await producer.send_and_wait(kafka.topic(topic), key=key.encode(), value=value)

    try:
        for name in ("completed-1", "completed-2"):
            prompt = by_row[name]
            done = CompletionRecord.from_prompt(prompt, content="ok", model="m")
            await send(COMPLETIONS, prompt.prompt_id, done.encode())
        dead = by_row["dead-1"]
        letter = DeadLetter.for_payload(
            "generate", "http_400", "context too long", dead.encode(), dead.prompt_id
        )
        await send(DEAD_LETTERS, dead.prompt_id, letter.encode())
        marked = by_row["marked-1"].prompt_id
        settings = settings_hash("m", {}, True, "final")
        await send(GENERATED, ledger_key(marked, settings), ledger_value(marked, settings, "s"))
        conversation = by_row["conv-1"]
        for turn in range(2):
            turn_id = turn_prompt_id(conversation.prompt_id, turn, 2)
            done = CompletionRecord.from_prompt(conversation, content="ok")
            done.prompt_id = turn_id
            await send(COMPLETIONS, turn_id, done.encode())
    finally:
        await producer.stop()


async def commit_past_every_prompt(kafka: KafkaSettings) -> dict[int, int]:
    """The generate group's offsets at the end of every partition, as after the lost run."""
    topic = kafka.topic(PROMPTS)
    consumer = AIOKafkaConsumer(
        **kafka.aiokafka_kwargs(), group_id=kafka.group(GENERATE_GROUP), enable_auto_commit=False
    )
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(kafka.partitions)]
        consumer.assign(partitions)
        ends = await consumer.end_offsets(partitions)
        await consumer.commit({tp: OffsetAndMetadata(end, "") for tp, end in ends.items()})
    finally:
        await consumer.stop()
    return {tp.partition: end for tp, end in ends.items()}


def draftgen(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), env=dict(os.environ), capture_output=True, text=True, timeout=120
    )


def test_audit_lists_the_prompt_without_an_outcome_and_republishes_it(
    bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=topic_prefix, partitions=4)
    source = tmp_path / "audit.jsonl"
    source.write_bytes(b"".join(row(name) for name in ROWS))
    conversation = tmp_path / "conversation.jsonl"
    conversation.write_bytes(row("conv-1", turns=2))
    asyncio.run(publish(kafka, [parse_source_spec(str(source))], progress=False))
    asyncio.run(
        publish(kafka, [parse_source_spec(str(conversation))], progress=False, regen=EVERY_TURN)
    )
    published = asyncio.run(read_prompts(kafka))
    by_row = {record.source_id or "": record for _, _, record in published}
    assert set(by_row) == {*ROWS, "conv-1"}
    asyncio.run(write_outcomes(kafka, by_row))
    committed = asyncio.run(commit_past_every_prompt(kafka))

    flags = ["--bootstrap", bootstrap, "--topic-prefix", topic_prefix]
    audited = draftgen(*draftgen_argv("audit", *flags))
    assert audited.returncode == 1, audited.stderr
    lines = audited.stdout.splitlines()
    lost = by_row["lost-1"]
    where = next((p, o) for p, o, record in published if record.source_id == "lost-1")
    assert lines[0] == "1 of 6 prompts have no outcome"
    assert lines[2].split() == [
        lost.prompt_id,
        "audit.jsonl",
        "lost-1",
        f"{where[0]}@{where[1]}",
        "lost",  # the generate group committed past it
    ]
    assert len(lines) == 4 and lines[3].startswith("republish them: ")

    as_json = draftgen(*draftgen_argv("audit", *flags, "--as-json"))
    assert as_json.returncode == 1, as_json.stderr
    data: dict[str, Any] = orjson.loads(as_json.stdout)
    assert (data["prompts"], data["missing"], data["pending"]) == (6, 1, 0)
    assert [m["prompt_id"] for m in data["missing_prompts"]] == [lost.prompt_id]

    # the command exactly as printed
    republished = draftgen(*shlex.split(lines[3].removeprefix("republish them: ")))
    assert republished.returncode == 0, republished.stderr
    assert republished.stdout.startswith("re-published 1 prompts"), republished.stdout

    again = asyncio.run(read_prompts(kafka))
    assert len(again) == len(published) + 1
    partition, offset, copy = next(
        (p, o, r) for p, o, r in again if r.prompt_id == lost.prompt_id and o != where[1]
    )
    assert copy == lost  # the same record: no ledger mark, so a worker generates it
    assert offset >= committed[partition]  # beyond the group's offset: its next to take

    # still without an outcome, now pending, listed once
    after = draftgen(*draftgen_argv("audit", *flags, "--as-json"))
    assert after.returncode == 1, after.stderr
    data = orjson.loads(after.stdout)
    assert (data["prompts"], data["records"], data["missing"], data["pending"]) == (6, 7, 1, 1)
    assert data["missing_prompts"][0]["copies"] == 2
    assert data["missing_prompts"][0]["offset"] == offset


# -- the dataset's settings, regenerate copies, a version's completions, retention ------------

SAMPLING = {"temperature": 0.6, "top_p": 0.95, "max_tokens": 64, "seed": None}


def answered(prompt: PromptRecord, model: str = "model-a") -> CompletionRecord:
    """A completion as streams/generate/client.py writes it, from this copy of the prompt."""
    return CompletionRecord.from_prompt(
        prompt,
        content=f"answer to {prompt.source_id}",
        reasoning_content="thought",
        finish_reason="stop",
        model=model,
        sampling={**SAMPLING, "chat_template_kwargs": {"enable_thinking": True}},
    )


async def produce(kafka: KafkaSettings, topic: str, records: list[tuple[str, bytes]]) -> None:
    producer = AIOKafkaProducer(**kafka.aiokafka_kwargs(), **kafka.producer_kwargs())
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(kafka.topic(topic), key=key.encode(), value=value)
    finally:
        await producer.stop()


async def delete_prompts_before(kafka: KafkaSettings, partition: int, offset: int) -> None:
    """What the prompts topic's retention does to a partition's oldest records."""
    admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
    await admin.start()
    try:
        at = {TopicPartition(kafka.topic(PROMPTS), partition): RecordsToDelete(offset)}
        await admin.delete_records(at)
    finally:
        await admin.close()


async def commit_generate(kafka: KafkaSettings, offsets: dict[int, int]) -> None:
    consumer = AIOKafkaConsumer(
        **kafka.aiokafka_kwargs(), group_id=kafka.group(GENERATE_GROUP), enable_auto_commit=False
    )
    await consumer.start()
    try:
        topic = kafka.topic(PROMPTS)
        consumer.assign([TopicPartition(topic, p) for p in offsets])
        await consumer.commit(
            {TopicPartition(topic, p): OffsetAndMetadata(o, "") for p, o in offsets.items()}
        )
    finally:
        await consumer.stop()


def audit_json(env: dict[str, str], *argv: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        draftgen_argv("audit", *argv, "--as-json"),
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1) and done.stdout, done.stderr
    return done.returncode, orjson.loads(done.stdout)


def test_audit_proves_the_dataset_version(
    pipeline: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in pipeline.env.items():
        monkeypatch.setenv(name, value)  # for `seal` in this process
    kafka = pipeline.kafka
    source = tmp_path / "rows.jsonl"
    names = [f"row-{i}" for i in range(12)] + ["marked-b", "again"]
    source.write_bytes(b"".join(row(name) for name in names))
    pipeline.publish(source)
    by_row = {r.source_id: r for _, _, r in asyncio.run(read_prompts(kafka))}
    assert len(by_row) == len(names)
    # model-a answers every prompt but one, which only model-b's ledger mark has
    done = [by_row[name] for name in names if name != "marked-b"]
    # first, an undecodable record (a tokenize dead letter) that row-0's answer replaces
    records = [(by_row["row-0"].prompt_id, b"not a completion")]
    records += [(p.prompt_id, answered(p).encode()) for p in done]
    asyncio.run(produce(kafka, COMPLETIONS, records))
    marked = by_row["marked-b"].prompt_id
    b = settings_hash("model-b", SAMPLING, True, "final")
    asyncio.run(produce(kafka, GENERATED, [(ledger_key(marked, b), ledger_value(marked, b, "s"))]))
    committed = asyncio.run(commit_past_every_prompt(kafka))
    worker = pipeline.tokenize()
    store = pipeline.store()
    wait_for(
        lambda: dataset_figures(store).samples == len(done),
        180,
        lambda: str(dataset_figures(store)),
    )
    version = ["--out", pipeline.out, "--dataset", pipeline.dataset]
    flags = ["--bootstrap", pipeline.bootstrap, "--topic-prefix", pipeline.prefix]

    # any settings: every prompt has an outcome; the dataset's (model-a's): model-b's does not
    code, data = audit_json(pipeline.env, *flags)
    assert (code, data["missing"], data["settings"]) == (0, 0, None)
    code, data = audit_json(pipeline.env, *flags, *version)
    a = settings_hash("model-a", SAMPLING, True, "final")
    assert (code, data["settings"], data["missing"]) == (1, {a: "model-a"}, 1)
    assert [m["prompt_id"] for m in data["missing_prompts"]] == [marked]
    checked = data["version"]
    # every completion below the committed offsets, the undecodable one too (its dead letter)
    assert (checked["sealed"], checked["checked"], checked["unaccounted"]) == (
        False,
        len(records),
        0,
    )
    assert checked["samples_by_settings"] == {a: len(done)}

    # published again to be regenerated: it needs an outcome made from that copy
    again = tmp_path / "again.jsonl"
    again.write_bytes(row("again"))
    asyncio.run(publish(kafka, [parse_source_spec(str(again))], progress=False, regenerate=True))
    copy = next(r for _, _, r in asyncio.run(read_prompts(kafka)) if r.meta.get("regenerate"))
    _, data = audit_json(pipeline.env, *flags, *version)
    assert {(m["prompt_id"], m["state"]) for m in data["missing_prompts"]} == {
        (marked, "lost"),
        (copy.prompt_id, "pending-since-republished"),
    }
    asyncio.run(produce(kafka, COMPLETIONS, [(copy.prompt_id, answered(copy).encode())]))
    wait_for(lambda: dataset_figures(store).replaced == 1, 180, lambda: str(dataset_figures(store)))
    _, data = audit_json(pipeline.env, *flags, *version)
    assert [m["prompt_id"] for m in data["missing_prompts"]] == [marked]

    # a window whose marker is gone: its completions are in no window of the version, sealed too
    worker.stop()
    marker = store.markers()[0]
    store.fs.rm_file(store.layout.marker(marker.partition, marker.start_offset, marker.epoch))
    assert main(["seal", *version, *flags]) == 0
    _, data = audit_json(pipeline.env, *flags, *version)
    checked = data["version"]
    assert (
        checked["sealed"] and checked["unaccounted"] == marker.end_offset - marker.start_offset + 1
    )
    assert {u["why"] for u in checked["unaccounted_completions"]} == {"no window"}
    assert {u["partition"] for u in checked["unaccounted_completions"]} == {marker.partition}

    # retention: a partition deleted before the generate group read it, and a claimed prompt
    # whose record went with it
    partition = next(p for p, end in committed.items() if end)
    asyncio.run(commit_generate(kafka, {partition: 0}))
    asyncio.run(delete_prompts_before(kafka, partition, committed[partition]))
    # (a request claimed, never answered, its prompt no longer in the topic)
    claim = f"{ledger_key('f' * 32, b)}!claim"
    asyncio.run(produce(kafka, GENERATED, [(claim, b"{}")]))
    code, data = audit_json(pipeline.env, *flags)
    kept = data["retention"]
    assert (code, kept["deleted"], kept["unread"]) == (
        1,
        committed[partition],
        committed[partition],
    )
    assert kept["claimed_gone"] == ["f" * 32] and kept["unknown_partitions"] == []
