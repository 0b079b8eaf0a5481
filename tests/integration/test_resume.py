"""A stopped `draftgen run` continues when the same command is given again.

One command, stopped the way a user stops it at three moments and once killed outright, then
given again each time from the same directory (no --workdir): while it publishes (Ctrl-C), mid-
generation (kill -9 of the run and everything it started, as a lost machine), once every prompt
is in the dataset but before the run has ended (Ctrl-C, during its audit and summary), and
finally to its end. The dataset it ends with is the one an uninterrupted run builds: every
prompt once, nothing lost; each prompt was published once and generated once (the prompts topic
holds one record per prompt, the completions topic one per prompt but for a prompt the kill -9
caught between its completion's write and its outcome's in the ledger, docs/failures.md)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from compose.stack import draftgen_argv
from streams.core.ledger import generated_prompt_ids, read_generated
from streams.core.normalize import make_prompt_record
from streams.core.settings import COMPLETIONS, PROMPTS, KafkaSettings
from streams.core.topic_reader import TopicReader
from streams.tools.progress import dataset_figures
from tests.compose.test_interrupt import Watched
from tests.polling import wait_for

pytestmark = pytest.mark.integration

PROMPT_COUNT = 60
# blank lines before each prompt of the source after the first few: a slow source (~0.1 s a
# row), so that publishing takes seconds and can be interrupted half-way (blank lines are
# skipped, as in any JSONL file)
FAST_ROWS = 5
PADDING = 1_200_000


async def _topic_size(kafka: KafkaSettings, topic: str) -> int:
    consumer = AIOKafkaConsumer(**kafka.aiokafka_kwargs(), enable_auto_commit=False)
    await consumer.start()
    try:
        name = kafka.topic(topic)
        await consumer._client.force_metadata_update()
        ids = consumer.partitions_for_topic(name) or set()
        ends = await consumer.end_offsets([TopicPartition(name, p) for p in ids])
        return sum(ends.values())
    finally:
        await consumer.stop()


def topic_size(kafka: KafkaSettings, topic: str) -> int:
    return asyncio.run(_topic_size(kafka, topic))


async def _keys(kafka: KafkaSettings, topic: str) -> Counter[str]:
    reader = TopicReader(kafka, kafka.topic(topic))
    keys: Counter[str] = Counter()
    try:
        if await reader.open():
            await reader.read_to_end(lambda record: keys.update([record.key.decode()]))
    finally:
        await reader.close()
    return keys


def completion_keys(kafka: KafkaSettings) -> Counter[str]:
    """How many completions each prompt has on the topic."""
    return asyncio.run(_keys(kafka, COMPLETIONS))


def test_a_run_stopped_three_ways_resumes_to_the_dataset_of_an_uninterrupted_run(
    pipeline, write_prompts, tmp_path: Path
) -> None:
    plain = write_prompts(PROMPT_COUNT, name="plain.jsonl")
    lines = plain.read_bytes().splitlines()
    ids = {make_prompt_record(orjson.loads(line), "prompts.jsonl").prompt_id for line in lines}
    source = tmp_path / "prompts.jsonl"
    source.write_bytes(
        b"".join(
            b"\n" * (PADDING if i >= FAST_ROWS else 0) + line + b"\n"
            for i, line in enumerate(lines)
        )
    )
    argv = draftgen_argv(
        "run",
        str(source),
        "--out",
        pipeline.out,
        "--dataset",
        "resumed",
        "--emulator-tokens-per-s",
        "150",
        "--claim-s",
        "6",
        *pipeline.common,
    )
    kafka, store = pipeline.kafka, pipeline.store("resumed")
    runs: list[Watched] = []

    def start() -> Watched:
        logs = tmp_path / f"run-{len(runs)}"
        runs.append(Watched(argv, logs, cwd=tmp_path, env={**os.environ, **pipeline.env}))
        return runs[-1]

    def prompt_ids() -> set[str]:
        return dataset_figures(store).prompt_ids

    try:
        # 1. Ctrl-C while it publishes: some prompts on the topic, not all
        first = start()
        wait_for(
            lambda: topic_size(kafka, PROMPTS) > 0 or not first.running(),
            120,
            "the first prompts on the topic",
        )
        first.interrupt(signal.SIGINT)
        assert first.wait(120) == 130, first.text()
        assert "published " not in first.text(), "interrupted after publishing, not during"
        assert 0 < topic_size(kafka, PROMPTS) < PROMPT_COUNT
        assert "to resume, run the same command again" in first.text()

        # 2. kill -9 of the run and all it started, mid-generation
        second = start()
        wait_for(
            lambda: topic_size(kafka, COMPLETIONS) >= 10 or not second.running(),
            240,
            lambda: f"generation under way:\n{second.text()}",
        )
        assert second.running(), second.text()
        assert "resuming dataset resumed" in second.text()
        second.interrupt(signal.SIGKILL)
        second.wait(60)
        assert topic_size(kafka, PROMPTS) == PROMPT_COUNT
        assert topic_size(kafka, COMPLETIONS) < PROMPT_COUNT
        # a kill -9 between a completion's write and its outcome's in the ledger: that prompt
        # may be generated again (docs/failures.md); no other may
        stored = completion_keys(kafka)
        unsettled = set(stored) - generated_prompt_ids(asyncio.run(read_generated(kafka)))

        # 3. Ctrl-C once every prompt is in the dataset, before the run has ended
        third = start()
        wait_for(
            lambda: prompt_ids() >= ids or not third.running(),
            300,
            lambda: f"every prompt in the dataset:\n{third.text()}",
        )
        third.interrupt(signal.SIGINT)
        assert third.wait(120) == 130, f"it ended before it was interrupted:\n{third.text()}"

        # 4. to its end
        last = start()
        assert last.wait(300) == 0, last.text()
        assert "resuming dataset resumed" in last.text()
        assert f"{PROMPT_COUNT} of {PROMPT_COUNT} prompts generated, 0 to go" in last.text()
        # the audit of this run's prompts
        assert f"every prompt has an outcome ({PROMPT_COUNT} prompts)" in last.text()
    finally:
        for run in runs:
            run.clean_up()

    pipeline.assert_exactly_once(ids, dataset="resumed")
    assert topic_size(kafka, PROMPTS) == PROMPT_COUNT  # each prompt published once
    # and generated once, but for a completion the kill cut off from its ledger outcome
    answers = completion_keys(kafka)
    assert set(answers) == ids
    twice = {prompt_id for prompt_id, count in answers.items() if count > 1}
    assert twice <= unsettled, f"generated again: {sorted(twice - unsettled)}"
    # one run directory: each resume took up the first one's
    (workdir,) = (tmp_path / "runs").iterdir()
    # its workers' logs are files: no terminal escape codes (faust's start-up spinner wrote
    # them at the default log level)
    logs = sorted((workdir / "logs").glob("*.log"))
    assert any(log.name.startswith("generate") for log in logs), logs
    assert [log.name for log in logs if b"\x1b" in log.read_bytes()] == []
