"""Record encoding: one encode/decode point, versioned, and failures that name their kind."""

from __future__ import annotations

import dataclasses
import hashlib

import orjson
import pytest

from streams.core.records import (
    MAX_LETTER_PROMPT_ID,
    CompletionRecord,
    DeadLetter,
    PromptRecord,
    RecordError,
)
from tests.bad_records import (
    BAD_SHAPES,
    COMPLETION_FIELDS,
    DEAD_LETTER_FIELDS,
    PROMPT_FIELDS,
    completion_dict,
    dead_letter_dict,
    prompt_dict,
    with_field,
)
from tests.ids import as_list


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


def test_a_dead_letter_keeps_text_as_text_and_other_bytes_as_base64_once() -> None:
    text = DeadLetter.for_payload("generate", "bad_shape", "m", '{"a": "é"}'.encode(), "p1")
    assert (text.payload, text.payload_b64) == ('{"a": "é"}', None)
    raw = b"ab\xffcd" * 1000
    letter = DeadLetter.decode(
        DeadLetter.for_payload("generate", "invalid_utf8", "bad bytes", raw, "p1").encode()
    )
    assert (letter.stage, letter.kind, letter.prompt_id) == ("generate", "invalid_utf8", "p1")
    assert letter.payload_bytes() == raw
    assert (letter.payload_size, letter.payload_truncated) == (len(raw), False)
    assert letter.payload_sha256 == hashlib.sha256(raw).hexdigest()
    # base64 once: 4/3 of the payload, where backslash escapes made it ~5x
    assert len(letter.encode()) < len(raw) * 4 / 3 + 500


def test_an_old_dead_letter_is_still_read() -> None:
    old = orjson.dumps({"v": 1, "stage": "generate", "kind": "k", "message": "m", "payload": "x"})
    letter = DeadLetter.decode(old)
    assert letter.payload_bytes() == b"x"
    assert (letter.payload_size, letter.payload_truncated) == (None, False)


@pytest.mark.parametrize(
    "raw",
    [b"\xff" * 50_000, b"\x00" * 50_000, ("é" * 30_000).encode(), b'{"k": "' + b"a" * 60_000],
    ids=["invalid_utf8", "control_chars", "multibyte", "json"],
)
@pytest.mark.parametrize("limit", [4_000, 20_000, 10**6])
def test_a_dead_letter_encoded_within_a_limit_says_what_it_cut(raw: bytes, limit: int) -> None:
    letter = DeadLetter.for_payload("tokenize", "invalid_utf8", "m" * 5000, raw, "p" * 5000)
    encoded = letter.encode_within(limit)
    assert len(encoded) <= limit
    decoded = DeadLetter.decode(encoded)
    assert len(decoded.prompt_id or "") == MAX_LETTER_PROMPT_ID
    assert decoded.payload_size == len(raw)
    assert decoded.payload_sha256 == hashlib.sha256(raw).hexdigest()
    kept = decoded.payload_bytes()
    assert raw.startswith(kept)
    assert decoded.payload_truncated == (len(kept) < len(raw))
    if limit == 10**6 and raw[:1] != b"\x00":  # room for all of it (NUL escapes 6x)
        assert kept == raw and encoded == letter.encode()
    if limit == 20_000:
        assert len(kept) > 10_000  # cut to the room left, not dropped


def test_a_letter_encoded_within_nothing_keeps_its_reason_size_and_hash() -> None:
    letter = DeadLetter.for_payload("generate", "k", "why", b"x" * 100, "p1", "prompts-3@7")
    bare = DeadLetter.decode(letter.encode_within(0))
    assert (bare.kind, bare.message, bare.origin) == ("k", "why", "prompts-3@7")
    assert (bare.payload_bytes(), bare.payload_size, bare.payload_truncated) == (b"", 100, True)


# -- every field checked for type and range where it is decoded ------------------------------

RECORDS = {
    PromptRecord: (prompt_dict("p1"), PROMPT_FIELDS),
    CompletionRecord: (completion_dict("p1"), COMPLETION_FIELDS),
    DeadLetter: (dead_letter_dict(), DEAD_LETTER_FIELDS),
}


@pytest.mark.parametrize("record_type", list(RECORDS), ids=lambda t: t.__name__)
def test_every_field_has_a_check_and_a_wrong_value_case(record_type: type) -> None:
    names = {f.name for f in dataclasses.fields(record_type)}
    valid, wrong = RECORDS[record_type]
    assert set(record_type._checks) == names
    assert set(wrong) == names
    assert set(valid) - {"v"} == names
    record_type.decode(orjson.dumps(valid))  # the valid base decodes


CASES = [
    (record_type, name, value, kind)
    for record_type, (_, wrong) in RECORDS.items()
    for name, (value, kind) in wrong.items()
]


@pytest.mark.parametrize(
    ("record_type", "name", "value", "kind"),
    CASES,
    ids=[f"{t.__name__}.{name}" for t, name, _, _ in CASES],
)
def test_a_field_of_the_wrong_type_is_one_record_error(
    record_type: type, name: str, value: object, kind: str
) -> None:
    valid, _ = RECORDS[record_type]
    with pytest.raises(RecordError) as caught:
        record_type.decode(with_field(valid, name, value))
    assert caught.value.kind == kind
    assert repr(name) in caught.value.message


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([True, False], "integer token ids"),
        ([1, -1], "negative token id"),
        ([1, 2.0], "integer token ids"),
        ([1, "2"], "integer token ids"),
        ([1, [2]], "integer token ids"),
        ("123", "list of token ids"),
    ],
)
def test_token_ids_are_non_negative_integers(value: object, problem: str) -> None:
    with pytest.raises(RecordError) as caught:
        CompletionRecord.decode(with_field(completion_dict("p"), "output_token_ids", value))
    assert caught.value.kind == "bad_token_ids" and problem in caught.value.message


@pytest.mark.parametrize(
    ("meta", "problem"),
    [({"conversation_id": 3}, "conversation_id"), ({"regen": ["every-turn"]}, "regen")],
)
def test_meta_keys_the_stages_read_are_checked(meta: object, problem: str) -> None:
    with pytest.raises(RecordError) as caught:
        PromptRecord.decode(with_field(prompt_dict("p"), "meta", meta))
    assert caught.value.kind == "bad_shape" and problem in caught.value.message


@pytest.mark.parametrize("shape", list(BAD_SHAPES))
def test_each_malformed_shape_has_its_kind(shape: str) -> None:
    raw, kind = BAD_SHAPES[shape]
    for record_type in RECORDS:
        with pytest.raises(RecordError) as caught:
            record_type.decode(raw)
        assert caught.value.kind == kind


def _completion(prompt_ids: object, output_ids: object) -> CompletionRecord:
    prompt = PromptRecord(prompt_id="p", messages=[{"role": "user", "content": "q"}])
    return CompletionRecord.from_prompt(
        prompt, prompt_token_ids=prompt_ids, output_token_ids=output_ids
    )


def test_token_ids_are_written_packed_and_read_back() -> None:
    # a 128K-token output with ids up to the top of uint32 (vocabularies are far smaller)
    output = [i * 32749 % 163840 for i in range(128 * 1024)] + [0, 2**32 - 1]
    completion = _completion([5, 6, 7], output)
    raw = completion.encode()
    data = orjson.loads(raw)
    assert "output_token_ids" not in data and "prompt_token_ids" not in data
    assert isinstance(data["output_token_ids_u32"], str)
    # 4 bytes per id in base64: 5.33 characters, where the JSON list takes ~6.3 for these ids
    assert len(data["output_token_ids_u32"]) < 5.4 * len(output)
    assert len(raw) < 0.86 * len(orjson.dumps(output))
    decoded = CompletionRecord.decode(raw)
    assert decoded == completion
    assert as_list(decoded.output_token_ids) == output
    assert as_list(decoded.prompt_token_ids) == [5, 6, 7]


def test_empty_and_missing_ids_round_trip() -> None:
    for prompt_ids, output_ids in (([], [1]), (None, None)):
        completion = _completion(prompt_ids, output_ids)
        assert CompletionRecord.decode(completion.encode()) == completion


def test_records_with_json_id_lists_are_still_read() -> None:
    """Completions written before packing (the topic keeps them forever: replay reads them)."""
    raw = orjson.dumps(
        {**completion_dict("p"), "prompt_token_ids": [1, 2], "output_token_ids": [3]}
    )
    decoded = CompletionRecord.decode(raw)
    assert as_list(decoded.prompt_token_ids) == [1, 2] and as_list(decoded.output_token_ids) == [3]


@pytest.mark.parametrize("ids", [[1, -1], [1, 2**32], [True], [1, 2.0], [1, "2"], [1, [2]]])
def test_ids_that_cannot_be_packed_stay_a_list_and_fail_decoding_as_before(ids: list) -> None:
    raw = _completion([1], ids).encode()
    data = orjson.loads(raw)
    assert data["output_token_ids"] == ids and "output_token_ids_u32" not in data
    if ids == [1, 2**32]:  # out of uint32 but a valid id shape: the vocabulary check drops it
        assert CompletionRecord.decode(raw).output_token_ids == ids
        return
    with pytest.raises(RecordError) as caught:
        CompletionRecord.decode(raw)
    assert caught.value.kind == "bad_token_ids"


@pytest.mark.parametrize(
    ("packed", "problem"),
    [
        (123, "expected a string"),
        ("not base64!", "not base64"),
        ("AQID", "not whole uint32s"),  # 3 bytes
    ],
)
def test_bad_packed_ids_are_bad_token_ids(packed: object, problem: str) -> None:
    raw = with_field(completion_dict("p"), "output_token_ids_u32", packed)
    with pytest.raises(RecordError) as caught:
        CompletionRecord.decode(raw)
    assert caught.value.kind == "bad_token_ids" and problem in caught.value.message
