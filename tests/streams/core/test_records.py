"""Record encoding: one encode/decode point, versioned, and failures that name their kind."""

from __future__ import annotations

import orjson
import pytest

from streams.core.records import CompletionRecord, DeadLetter, PromptRecord, RecordError


def test_prompt_round_trip_keeps_every_field() -> None:
    prompt = PromptRecord(
        prompt_id="abc",
        messages=[{"role": "user", "content": "héllo"}],
        source="s.jsonl",
        tools=[{"type": "function", "function": {"name": "f"}}],
        meta={"row": 3},
    )
    raw = prompt.encode()
    assert orjson.loads(raw)["v"] == 1
    assert PromptRecord.decode(raw) == prompt


def test_completion_carries_prompt_fields_and_generated_turn() -> None:
    prompt = PromptRecord(prompt_id="p1", messages=[{"role": "user", "content": "q"}], source="x")
    completion = CompletionRecord.from_prompt(
        prompt,
        reasoning_content="think",
        content="answer",
        finish_reason="stop",
        prompt_token_ids=[1, 2],
        output_token_ids=[3, 4],
    )
    decoded = CompletionRecord.decode(completion.encode())
    assert decoded == completion
    assert decoded.generated_message() == {
        "role": "assistant",
        "content": "answer",
        "reasoning_content": "think",
    }


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    raw = orjson.dumps({"v": 1, "prompt_id": "p", "messages": [], "later_field": 1})
    assert PromptRecord.decode(raw).prompt_id == "p"


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b"not json", "not_json"),
        (b'{"prompt_id": "\xff\xfe"}', "invalid_utf8"),
        (b"[1, 2]", "bad_shape"),
        (b'{"v": 1, "messages": []}', "bad_shape"),
        (b'{"v": 2, "prompt_id": "p", "messages": []}', "bad_version"),
    ],
)
def test_bad_values_fail_with_a_kind(raw: bytes, kind: str) -> None:
    with pytest.raises(RecordError) as caught:
        PromptRecord.decode(raw)
    assert caught.value.kind == kind


def test_dead_letter_keeps_undecodable_payload_visible() -> None:
    letter = DeadLetter.for_payload("generate", "invalid_utf8", "bad bytes", b"ab\xffcd", "p1")
    decoded = DeadLetter.decode(letter.encode())
    assert decoded.payload == "ab\\xffcd"
    assert (decoded.stage, decoded.kind, decoded.prompt_id) == ("generate", "invalid_utf8", "p1")
