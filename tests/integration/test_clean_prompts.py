"""Cleaning at publish on a real broker: a prompt repeated across two sources with changed
whitespace is published once, one with a sentence added too when near duplicates are asked
for; a prompt that contains an evaluation task is listed as
contaminated (a dead letter naming its row and the words it shares) and not published."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.integration.probes import topic_size
from tests.producers.test_clean import EVAL_TASKS

TASK = (
    "Here is my homework. def count_vowel_runs(text): '''Count how many maximal runs of "
    "consecutive vowels appear in the given text, ignoring case.''' Please finish it."
)


LONG = (
    "I maintain a small web service written in Go that reads orders from a queue, validates "
    "them against a product catalogue held in memory, and writes accepted orders to Postgres. "
    "Under load the service's memory grows until it is killed, and the heap profile shows most "
    "of it in the catalogue, which is reloaded every minute from a JSON file of two hundred "
    "megabytes. How would you change the reload so that memory stays flat, the catalogue is "
    "never half updated while a request reads it, and a bad file does not take the service down?"
)


def rows(*texts: str) -> bytes:
    return b"".join(
        orjson.dumps({"messages": [{"role": "user", "content": t}]}) + b"\n" for t in texts
    )


def test_publish_removes_whitespace_duplicates_across_sources_and_contaminated_prompts(
    pipeline, tmp_path: Path
) -> None:
    first, second = tmp_path / "chat.jsonl", tmp_path / "code.jsonl"
    first.write_bytes(rows("How do I reverse a list in Python?", "What is a monad?", LONG))
    second.write_bytes(
        rows("How do I  reverse a list\nin Python? ", TASK, "Explain TCP.", LONG + " Thanks!")
    )
    done = pipeline.draftgen(
        "publish",
        str(first),
        str(second),
        "--decontaminate",
        str(EVAL_TASKS),
        "--near-duplicates",
        "0.8",
        "--no-progress",
        *pipeline.common,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(
        "rejected 0, removed as contaminated 1, removed as duplicate_text 1, "
        "removed as near_duplicate 1"
    ), done.stdout
    assert "published 4," in done.stdout
    assert topic_size(pipeline.kafka, "prompts") == 4

    letters = {letter.kind: letter for letter in pipeline.dead_letters()}
    assert set(letters) == {"contaminated", "duplicate_text", "near_duplicate"}
    contaminated, duplicate = letters["contaminated"], letters["duplicate_text"]
    assert (contaminated.stage, contaminated.origin) == ("publish", f"{second}:1")
    assert "evaluation set eval_tasks.jsonl" in contaminated.message
    assert "count how many maximal runs of consecutive vowels" in contaminated.message
    assert duplicate.origin == f"{second}:0" and "the same text" in duplicate.message
    assert letters["near_duplicate"].origin == f"{second}:3"

    # `dead-letters --republish` leaves removals alone unless a removal is named by its kind
    def republish(*flags: str) -> str:
        done = pipeline.draftgen(
            "dead-letters", "--republish", *flags, *pipeline.common, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert republish().strip() == (
        "re-published 0; left as removed at publish: contaminated 1, duplicate_text 1, "
        "near_duplicate 1 (--kind KIND sends them)"
    )
    assert topic_size(pipeline.kafka, "prompts") == 4
    assert republish("--kind", "duplicate_text").startswith("re-published 1")
    assert topic_size(pipeline.kafka, "prompts") == 5
