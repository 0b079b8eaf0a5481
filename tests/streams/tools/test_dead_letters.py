"""`draftgen dead-letters` lists the failed prompts, not only counts: prompt id, the source
row's id, stage and reason, as text and as JSON."""

from __future__ import annotations

import orjson

from streams.core.records import CompletionRecord, DeadLetter, PromptRecord
from streams.tools.dead_letters import as_json, failed_prompts, listing

MESSAGES = [{"role": "user", "content": "hi"}]


def letters() -> list[DeadLetter]:
    rejected = DeadLetter.for_payload(
        "publish", "bad_shape", "p.jsonl row 3: no 'messages'", b'{"id": "row-3"}'
    )
    rejected.source_id = "row-3"
    prompt = PromptRecord("p-gen", MESSAGES, source="p.jsonl", source_id="row-5")
    completion = CompletionRecord("p-tok", MESSAGES, source="p.jsonl", source_id="row-9")
    generate = DeadLetter.for_payload(
        "generate", "retries_exhausted", "HTTP 503 5 times", prompt.encode(), "p-gen"
    )
    return [
        rejected,
        generate,
        # the same failure sent again after a crash: one failed prompt
        DeadLetter.for_payload(
            "generate", "retries_exhausted", "HTTP 503 5 times", prompt.encode(), "p-gen"
        ),
        DeadLetter.for_payload(
            "tokenize", "policy_length", "cut by --max-tokens", completion.encode(), "p-tok"
        ),
        DeadLetter.for_payload("tokenize", "not_json", "bad bytes", b"\xff", None),
    ]


def test_each_failed_prompt_is_listed_with_its_source_id_stage_and_reason() -> None:
    failed = failed_prompts(letters())
    assert [(f.prompt_id, f.source_id, f.stage, f.kind) for f in failed] == [
        (None, "row-3", "publish", "bad_shape"),
        ("p-gen", "row-5", "generate", "retries_exhausted"),
        ("p-tok", "row-9", "tokenize", "policy_length"),
        (None, None, "tokenize", "not_json"),
    ]
    lines = listing(letters())
    assert lines[0] == "5 dead letters"
    header = next(i for i, line in enumerate(lines) if line.startswith("prompt id"))
    assert lines[header].split() == ["prompt", "id", "source", "id", "stage", "reason"]
    rows = [line.split(None, 3) for line in lines[header + 1 :]]
    assert rows == [
        ["-", "row-3", "publish", "bad_shape: p.jsonl row 3: no 'messages'"],
        ["p-gen", "row-5", "generate", "retries_exhausted: HTTP 503 5 times"],
        ["p-tok", "row-9", "tokenize", "policy_length: cut by --max-tokens"],
        ["-", "-", "tokenize", "not_json: bad bytes"],
    ]


def test_the_json_listing_has_the_counts_and_every_failed_prompt() -> None:
    data = orjson.loads(orjson.dumps(as_json(letters())))
    assert data["dead_letters"] == 5
    assert {"stage": "generate", "kind": "retries_exhausted", "count": 2} in data["by_reason"]
    assert [
        (p["prompt_id"], p["source_id"], p["stage"], p["kind"], p["message"])
        for p in data["failed_prompts"]
    ][1:3] == [
        ("p-gen", "row-5", "generate", "retries_exhausted", "HTTP 503 5 times"),
        ("p-tok", "row-9", "tokenize", "policy_length", "cut by --max-tokens"),
    ]
