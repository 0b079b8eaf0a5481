"""A source row's own id and the source's name reach the records (and so the shards)."""

from __future__ import annotations

import orjson
import pytest

from producers.publish import source_name
from producers.sources import parse_source_spec
from streams.core.normalize import make_prompt_record
from streams.core.records import CompletionRecord, PromptRecord, RecordError
from tests.bad_records import completion_dict, prompt_dict

ROW = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("/work/someone/prompts/sample_prompts.jsonl", "sample_prompts.jsonl"),
        ("/work/someone/prompts/sample_prompts.jsonl:0.5", "sample_prompts.jsonl"),
        ("relative/code.parquet", "code.parquet"),
        ("s3://bucket/dir/agentic.jsonl.gz:2", "agentic.jsonl.gz"),
        ("s3://bucket/a-directory/", "a-directory"),
        ("hf:org/instruct:train", "hf:org/instruct:train"),
        ("hf:org/instruct:train:0.2", "hf:org/instruct:train"),
    ],
)
def test_the_source_is_named_by_its_file_or_hf_spec_never_a_local_path(
    spec: str, name: str
) -> None:
    assert source_name(parse_source_spec(spec)) == name


@pytest.mark.parametrize(
    ("row", "field", "source_id"),
    [
        ({**ROW, "id": "conv-17"}, "id", "conv-17"),
        ({**ROW, "id": 17}, "id", "17"),
        (ROW, "id", None),
        ({**ROW, "id": None}, "id", None),
        ({**ROW, "id": "ignored", "uid": "u-3"}, "uid", "u-3"),
        ({**ROW, "id": "x"}, "uid", None),
    ],
)
def test_the_rows_own_id_becomes_the_source_id(
    row: dict[str, object], field: str, source_id: str | None
) -> None:
    record = make_prompt_record(row, "prompts.jsonl", id_field=field)
    assert record.source_id == source_id
    # the prompt id stays the content hash: the same prompt under any id
    assert record.prompt_id == make_prompt_record(ROW, "other.jsonl").prompt_id
    decoded = PromptRecord.decode(record.encode())
    assert decoded.source_id == source_id
    completion = CompletionRecord.from_prompt(decoded, content="answer")
    assert CompletionRecord.decode(completion.encode()).source_id == source_id


@pytest.mark.parametrize("value", [["a"], {"a": 1}, 1.5, True])
def test_an_id_that_is_not_a_string_or_integer_is_refused_with_its_reason(value: object) -> None:
    with pytest.raises(RecordError) as caught:
        make_prompt_record({**ROW, "id": value}, "prompts.jsonl")
    assert caught.value.kind == "bad_source_id"
    assert "'id'" in caught.value.message


def test_records_written_before_source_id_decode_with_a_null_id() -> None:
    for record_type, make in ((PromptRecord, prompt_dict), (CompletionRecord, completion_dict)):
        old = make("p1")
        del old["source_id"]
        assert record_type.decode(orjson.dumps(old)).source_id is None
