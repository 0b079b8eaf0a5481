"""Poison records on the real broker: every field of the wrong type and every malformed shape,
produced straight onto `prompts` and `completions`, is one dead letter of its stage and kind;
every valid prompt still ends as a sample; no worker stops."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from streams.core.settings import COMPLETIONS, PROMPTS, KafkaSettings
from tests.bad_records import (
    BAD_SHAPES,
    COMPLETION_FIELDS,
    PROMPT_FIELDS,
    completion_dict,
    prompt_dict,
    with_field,
)

pytestmark = pytest.mark.integration


async def _send_raw(kafka: KafkaSettings, topic: str, values: dict[str, bytes]) -> None:
    producer = AIOKafkaProducer(**kafka.aiokafka_kwargs())
    await producer.start()
    try:
        for key, value in values.items():
            await producer.send_and_wait(kafka.topic(topic), key=key.encode(), value=value)
    finally:
        await producer.stop()


def poison(
    prefix: str, fields: dict[str, tuple[Any, str]], valid: Callable[[str], dict[str, Any]]
) -> tuple[dict[str, bytes], dict[str, str]]:
    """(key → value, key → expected kind) for each wrong field and each malformed shape."""
    values: dict[str, bytes] = {}
    kinds: dict[str, str] = {}
    for name, (value, kind) in fields.items():
        key = f"{prefix}-field-{name}"
        values[key] = with_field(valid(key), name, value)
        kinds[key] = kind
    for name, (raw, kind) in BAD_SHAPES.items():
        key = f"{prefix}-shape-{name}"
        values[key], kinds[key] = raw, kind
    return values, kinds


def test_each_poison_record_is_one_dead_letter_and_valid_prompts_still_end(
    pipeline, write_prompts
) -> None:
    pipeline.partitions = 2
    url, _ = pipeline.emulator()
    workers = [pipeline.generate(url), pipeline.tokenize()]
    prompts, prompt_kinds = poison("p", PROMPT_FIELDS, prompt_dict)
    completions, completion_kinds = poison("c", COMPLETION_FIELDS, completion_dict)

    summary = pipeline.publish(write_prompts(20))
    asyncio.run(_send_raw(pipeline.kafka, PROMPTS, prompts))
    asyncio.run(_send_raw(pipeline.kafka, COMPLETIONS, completions))
    # valid ones after the poison, on the same partitions
    later = pipeline.publish(write_prompts(10, name="later.jsonl", start=100))

    valid = set(summary.prompt_ids) | set(later.prompt_ids)
    expected = valid | set(prompts) | set(completions)
    result = pipeline.wait(expected, workers)
    pipeline.assert_exactly_once(expected)
    assert result.figures.samples == len(valid)

    letters = Counter(
        (letter.stage, letter.prompt_id, letter.kind) for letter in pipeline.dead_letters()
    )
    wanted = Counter({("generate", k, kind): 1 for k, kind in prompt_kinds.items()})
    wanted |= Counter({("tokenize", k, kind): 1 for k, kind in completion_kinds.items()})
    assert letters == wanted
    assert all(worker.alive() for worker in workers)
    for worker in workers:
        assert "We experienced a crash" not in worker.log_path.read_text()
