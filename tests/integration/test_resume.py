"""A stopped `draftgen run` continues when the same command is given again.

One command, stopped the way a user stops it, then given again each time from the same
directory (no --workdir): while it publishes (Ctrl-C), mid-generation (Ctrl-C, answers
running), mid-generation again (kill -9 of the run and everything it started, as a lost
machine), once every prompt is in the dataset but before the run has ended (Ctrl-C, during its
audit and summary), and finally to its end. The dataset it ends with is the one an
uninterrupted run builds: every prompt once, nothing lost; each prompt was published once and
generated once (the prompts topic holds one record per prompt, the completions topic one per
prompt). The one exception is the kill -9 bound (docs/failures.md): a prompt whose completion
the killed run wrote and whose outcome it had not yet written to the ledger is generated once
more by the next run, at most one per request slot of the killed workers.

Which run wrote a record is read from its timestamp (the producer's clock, on this host, set
before the record is sent): every run's window lies between its start and the moment all it
started had exited, so a record still in flight at a kill is judged by when it was made, not by
when the broker stored it."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from compose.stack import draftgen_argv
from streams.core.ledger import DEAD, outcome_key, split_key
from streams.core.normalize import make_prompt_record
from streams.core.settings import COMPLETIONS, GENERATED, PROMPTS, KafkaSettings
from streams.core.topic_reader import TopicReader
from streams.tools.progress import dataset_figures
from tests.compose.test_interrupt import Watched, alive
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


@dataclass(frozen=True)
class Written:
    """A record as its writer made it: key, where it is, and its timestamp (seconds)."""

    key: str
    at: float
    where: str


async def _records(kafka: KafkaSettings, topic: str) -> list[Written]:
    reader = TopicReader(kafka, kafka.topic(topic))
    found: list[Written] = []

    def take(record: Any) -> None:
        where = f"{record.topic}-{record.partition}@{record.offset}"
        found.append(Written(record.key.decode(), record.timestamp / 1000, where))

    try:
        if await reader.open():
            await reader.read_to_end(take)
    finally:
        await reader.close()
    return found


def records(kafka: KafkaSettings, topic: str) -> list[Written]:
    return asyncio.run(_records(kafka, topic))


@dataclass
class Stop:
    """One run of the command: how it was stopped, and when it ran (its children included)."""

    how: str
    started: float
    ended: float = float("inf")

    def wrote(self, record: Written) -> bool:
        return self.started <= record.at <= self.ended


def generated_twice(kafka: KafkaSettings, stops: list[Stop], killed: Stop) -> list[str]:
    """Each prompt generated more than once, unless only as the kill -9 bound allows: its first
    completion written by the killed run, whose outcome that run had not written to the ledger,
    and its second by a later run. Each named with its records and the stops they fell in."""

    def run_of(record: Written) -> str:
        return next((f"the run {s.how}" for s in stops if s.wrote(record)), "no run")

    by_prompt: dict[str, list[Written]] = {}
    for record in records(kafka, COMPLETIONS):
        by_prompt.setdefault(record.key, []).append(record)
    recorded = {
        split_key(r.key)[0]: r
        for r in records(kafka, GENERATED)
        if outcome_key(r.key) == r.key and not r.key.endswith(DEAD)
    }
    broken = []
    for prompt_id, written in sorted(by_prompt.items()):
        if len(written) < 2:
            continue
        first, *later = sorted(written, key=lambda r: r.at)
        outcome = recorded.get(prompt_id)
        if (
            len(later) == 1
            and killed.wrote(first)
            and not killed.wrote(later[0])
            and outcome is not None
            and not killed.wrote(outcome)
        ):
            continue  # the kill -9 bound
        said = "; ".join(
            f"{r.where} at {r.at:.3f} by {run_of(r)}" for r in sorted(written, key=lambda r: r.at)
        )
        when = f"{outcome.at:.3f} by {run_of(outcome)}" if outcome else "never"
        broken.append(f"{prompt_id}: {said}; its outcome written {when}")
    return broken


def test_a_run_stopped_four_ways_resumes_to_the_dataset_of_an_uninterrupted_run(
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
        # answers of seconds, longer than a Ctrl-C's drain (streams/cli/run.py RUN_DRAIN_S):
        # some finish and are recorded, the rest go back
        "--emulator-tokens-per-s",
        "40",
        "--claim-s",
        "6",
        *pipeline.common,
    )
    kafka, store = pipeline.kafka, pipeline.store("resumed")
    runs: list[Watched] = []
    stops: list[Stop] = []

    def start(how: str) -> Watched:
        logs = tmp_path / f"run-{len(runs)}"
        stops.append(Stop(how, time.time()))
        runs.append(Watched(argv, logs, cwd=tmp_path, env={**os.environ, **pipeline.env}))
        return runs[-1]

    def stopped(run: Watched) -> None:
        """Until everything the run started has exited: its window of writes is closed."""
        wait_for(
            lambda: not any(alive(p) for p in run.started()),
            60,
            lambda: f"every process of the run {stops[-1].how} exited",
        )
        stops[-1].ended = time.time()

    def prompt_ids() -> set[str]:
        return dataset_figures(store).prompt_ids

    def completions_more(more: int, run: Watched) -> None:
        """Until this run has written `more` completions (or more)."""
        count = topic_size(kafka, COMPLETIONS) + more
        wait_for(
            lambda: topic_size(kafka, COMPLETIONS) >= count or not run.running(),
            240,
            lambda: f"{count} completions:\n{run.text()}",
        )
        assert run.running(), run.text()
        assert "resuming dataset resumed" in run.text()

    try:
        # 1. Ctrl-C while it publishes: some prompts on the topic, not all
        first = start("stopped by Ctrl-C while publishing")
        wait_for(
            lambda: topic_size(kafka, PROMPTS) > 0 or not first.running(),
            120,
            "the first prompts on the topic",
        )
        first.interrupt(signal.SIGINT)
        assert first.wait(120) == 130, first.text()
        stopped(first)
        assert "published " not in first.text(), "interrupted after publishing, not during"
        assert 0 < topic_size(kafka, PROMPTS) < PROMPT_COUNT
        assert "to resume, run the same command again" in first.text()

        # 2. Ctrl-C mid-generation, answers running: their prompts go back, none is redone
        second = start("stopped by Ctrl-C mid-generation")
        completions_more(5, second)
        second.interrupt(signal.SIGINT)
        assert second.wait(120) == 130, second.text()
        stopped(second)

        # 3. kill -9 of the run and all it started, mid-generation
        third = start("killed -9 mid-generation")
        completions_more(5, third)
        third.interrupt(signal.SIGKILL)
        third.wait(60)
        stopped(third)
        assert topic_size(kafka, PROMPTS) == PROMPT_COUNT
        assert topic_size(kafka, COMPLETIONS) < PROMPT_COUNT

        # 4. Ctrl-C once every prompt is in the dataset, before the run has ended
        fourth = start("stopped by Ctrl-C once every prompt was in the dataset")
        wait_for(
            lambda: prompt_ids() >= ids or not fourth.running(),
            300,
            lambda: f"every prompt in the dataset:\n{fourth.text()}",
        )
        fourth.interrupt(signal.SIGINT)
        assert fourth.wait(120) == 130, f"it ended before it was interrupted:\n{fourth.text()}"
        stopped(fourth)

        # 5. to its end
        last = start("run to its end")
        assert last.wait(300) == 0, last.text()
        stopped(last)
        assert "resuming dataset resumed" in last.text()
        assert f"{PROMPT_COUNT} of {PROMPT_COUNT} prompts generated, 0 to go" in last.text()
        # the audit of this run's prompts
        assert f"every prompt has an outcome ({PROMPT_COUNT} prompts)" in last.text()
    finally:
        for run in runs:
            run.clean_up()

    pipeline.assert_exactly_once(ids, dataset="resumed")
    assert topic_size(kafka, PROMPTS) == PROMPT_COUNT  # each prompt published once
    # and generated once, but for a completion the kill -9 cut off from its ledger outcome
    assert {r.key for r in records(kafka, COMPLETIONS)} == ids
    assert generated_twice(kafka, stops, killed=stops[2]) == []
    # one run directory: each resume took up the first one's
    (workdir,) = (tmp_path / "runs").iterdir()
    # its workers' logs are files: no terminal escape codes (faust's start-up spinner wrote
    # them at the default log level)
    logs = sorted((workdir / "logs").glob("*.log"))
    assert any(log.name.startswith("generate") for log in logs), logs
    assert [log.name for log in logs if b"\x1b" in log.read_bytes()] == []
