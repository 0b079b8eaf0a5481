"""Continuous ingestion: a second source published while the run goes on, overlapping the
first, is taken without a restart; overlapping prompts are generated once, across publish runs
and worker restarts (the `generated` ledger); `--regenerate` forces a generation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from producers.publish import publish
from producers.sources import parse_source_spec
from streams.core.ledger import read_generated
from streams.core.records import PromptRecord
from streams.core.settings import GENERATE_GROUP, GENERATED, PROMPTS
from tests.integration.probes import (
    group_lag,
    key_counts,
    requests_served,
    send_raw,
    topic_size,
)
from tests.polling import wait_for

pytestmark = pytest.mark.integration


def _overlapping(first: Path, fresh: Path, out: Path, overlap: int) -> Path:
    """The last `overlap` rows of `first`, then the rows of `fresh`: a second source."""
    lines = first.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[-overlap:]) + fresh.read_bytes())
    return out


def test_second_source_mid_run_with_overlap_is_generated_once(
    pipeline, write_prompts, tmp_path
) -> None:
    url, _ = pipeline.emulator("--tokens-per-s", "200", "--seed", "0")
    generate = pipeline.generate(url)
    tokenize = pipeline.tokenize()
    first = write_prompts(120, name="a.jsonl")
    second = _overlapping(
        first, write_prompts(40, name="fresh.jsonl", start=500, seed=9), tmp_path / "b.jsonl", 60
    )
    a = pipeline.publish(first)
    wait_for(lambda: topic_size(pipeline.kafka) >= 30, 60, "the run under way")

    b = pipeline.publish(second)  # mid-run, no restart
    assert b.published + b.already_generated == 100
    expected = set(a.prompt_ids) | set(b.prompt_ids)
    assert len(expected) == 160
    pipeline.wait(expected, [generate, tokenize], timeout=90)
    pipeline.assert_exactly_once(expected)

    counts = key_counts(pipeline.kafka)
    assert set(counts) == expected and set(counts.values()) == {1}, "each prompt generated once"
    # each worker start asks the server once which way it returns token ids: one request more
    assert requests_served(url) == 160 + 1
    assert len(asyncio.run(read_generated(pipeline.kafka))) == 160
    # each prompt: its claim before the request, its outcome, and the claim's release
    assert topic_size(pipeline.kafka, GENERATED) == 3 * 160

    # The record survives a worker restart: copies slipped past `publish` are acked unasked.
    generate.stop()
    generate = pipeline.generate(url, name="generate-restarted")
    again = pipeline.publish(second)
    assert (again.published, again.already_generated) == (0, 100)
    copies = [
        (pid.encode(), PromptRecord(pid, c.messages, c.source, c.tools, c.meta).encode())
        for pid, c in list(pipeline.completions().items())[:20]
    ]
    send_raw(pipeline.kafka, PROMPTS, copies)  # as if a publish had raced the ledger
    wait_for(lambda: group_lag(pipeline.kafka, GENERATE_GROUP, PROMPTS) == 0, 60, "the copies")
    assert requests_served(url) == 160 + 2  # the restarted worker's probe

    # --regenerate forces it, past publish and past the workers' ledger.
    forced = asyncio.run(
        publish(
            pipeline.kafka,
            [parse_source_spec(str(first))],
            limit=10,
            progress=False,
            regenerate=True,
        )
    )
    assert forced.published == 10
    wait_for(lambda: topic_size(pipeline.kafka) == 170, 60, "the forced generations")
    assert requests_served(url) == 170 + 2
    counts = key_counts(pipeline.kafka)
    assert sorted(counts.values()).count(2) == 10
    pipeline.assert_exactly_once(expected)  # the dataset still holds each prompt once
    assert generate.alive()
