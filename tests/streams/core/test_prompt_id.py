"""prompt_id: pinned, its canonical form, and stable across forms, key order and a publish
round trip (hypothesis); make_prompt_record and the bundled samples."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.sources import SourceSpec, bundled_sample_path, iter_rows
from streams.core.normalize import (
    MESSAGE_KEYS,
    make_prompt_record,
    normalize_conversation,
    prompt_id,
    validate_prompt_messages,
)
from streams.core.records import PromptRecord


def _call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# --- prompt_id -----------------------------------------------------------------------------------

PINNED_CONVERSATION: dict[str, Any] = {
    "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Run the tests — then fix what fails."},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Start with the test run.",
            "tool_calls": [_call("call_1", "run_shell", {"command": "pytest -q"})],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "1 failed, 3 passed"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "run_shell",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        }
    ],
}
# Regression guard: computed once from PINNED_CONVERSATION. If this changes, every prompt_id in
# every topic changes; do it only deliberately, as a new canonical-form version.
PINNED_ID = "8c5dae744c769a9e6dfd924626a347d6"


def test_prompt_id_is_pinned() -> None:
    assert prompt_id(*normalize_conversation(PINNED_CONVERSATION)) == PINNED_ID


def test_prompt_id_canonical_form_is_as_documented() -> None:
    import hashlib

    messages, tools = normalize_conversation(PINNED_CONVERSATION)
    canonical = json.dumps(
        {"messages": messages, "tools": tools}, sort_keys=True, separators=(",", ":"),
        ensure_ascii=False,
    ).encode()  # fmt: skip
    assert prompt_id(messages, tools) == hashlib.sha256(canonical).hexdigest()[:32]


def test_prompt_id_shape_and_sensitivity() -> None:
    messages, tools = normalize_conversation(PINNED_CONVERSATION)
    pid = prompt_id(messages, tools)
    assert len(pid) == 32 and all(c in "0123456789abcdef" for c in pid)
    assert prompt_id(messages, None) == prompt_id(messages, [])
    assert prompt_id(messages, None) != pid
    changed = [*messages[:-1], {**messages[-1], "content": "1 failed, 3 passed "}]
    assert prompt_id(changed, tools) != pid


def test_prompt_id_ignores_the_dropped_answer_and_extra_fields() -> None:
    with_answer = {
        **PINNED_CONVERSATION,
        "id": "another-source-row",
        "messages": [*PINNED_CONVERSATION["messages"], {"role": "assistant", "content": "Fixed."}],
    }
    assert prompt_id(*normalize_conversation(with_answer)) == PINNED_ID


# --- hypothesis: stability properties ------------------------------------------------------------

_text = st.text(max_size=40)
_args = st.dictionaries(
    st.text(min_size=1, max_size=8),
    st.one_of(st.integers(-1000, 1000), _text, st.booleans(), st.none()),
    max_size=4,
)
_names = st.sampled_from(["run_shell", "read_file", "get_weather"])


@st.composite
def openai_conversations(draw: st.DrawFn) -> dict[str, Any]:
    """OpenAI-form rows with id-less tool calls, so they have an exact ShareGPT twin."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(_text)})
    for _ in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": draw(_text)})
        if draw(st.booleans()):
            calls = draw(st.lists(st.tuples(_names, _args), min_size=1, max_size=3))
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"function": {"name": name, "arguments": args}} for name, args in calls
                    ],
                }
            )
            messages.extend({"role": "tool", "content": draw(_text)} for _ in calls)
        if draw(st.booleans()):
            messages.append({"role": "assistant", "content": draw(_text)})
    tools = [{"type": "function", "function": {"name": n, "parameters": {}}} for n in ["f", "g"]]
    return {"messages": messages, "tools": tools if draw(st.booleans()) else None}


def to_sharegpt(raw: dict[str, Any]) -> dict[str, Any]:
    from_role = {"user": "human", "assistant": "gpt", "tool": "observation", "system": "system"}
    turns: list[dict[str, Any]] = []
    for message in raw["messages"]:
        if message.get("tool_calls"):
            calls = [call["function"] for call in message["tool_calls"]]
            turns.append({"from": "function_call", "value": json.dumps(calls)})
        else:
            turns.append({"from": from_role[message["role"]], "value": message["content"]})
    out: dict[str, Any] = {"conversations": turns}
    if raw["tools"]:
        out["tools"] = json.dumps([tool["function"] for tool in raw["tools"]])
    return out


def shuffled_keys(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: shuffled_keys(item, rng) for key, item in items}
    if isinstance(value, list):
        return [shuffled_keys(item, rng) for item in value]
    return value


@settings(max_examples=200, deadline=None)
@given(openai_conversations())
def test_sharegpt_twin_has_the_same_id(raw: dict[str, Any]) -> None:
    assert prompt_id(*normalize_conversation(raw)) == prompt_id(
        *normalize_conversation(to_sharegpt(raw))
    )


@settings(max_examples=200, deadline=None)
@given(openai_conversations(), st.randoms(use_true_random=False))
def test_key_order_does_not_change_the_id(raw: dict[str, Any], rng: random.Random) -> None:
    assert prompt_id(*normalize_conversation(raw)) == prompt_id(
        *normalize_conversation(shuffled_keys(raw, rng))
    )


@settings(max_examples=200, deadline=None)
@given(openai_conversations())
def test_normalization_is_idempotent_and_survives_a_publish_round_trip(
    raw: dict[str, Any],
) -> None:
    messages, tools = normalize_conversation(raw)
    assert all(set(message) <= set(MESSAGE_KEYS) for message in messages)
    again = normalize_conversation({"messages": messages, "tools": tools})
    assert again == (messages, tools)
    # A second publish run re-reads the record from Kafka: same bytes in, same id out.
    record = PromptRecord.decode(make_prompt_record(raw, source="s", meta={"row": 1}).encode())
    assert record.prompt_id == prompt_id(*normalize_conversation(orjson.loads(record.encode())))
    validate_prompt_messages(record.messages, record.tools)


# --- make_prompt_record and bundled samples ------------------------------------------------------


def test_make_prompt_record() -> None:
    record = make_prompt_record(PINNED_CONVERSATION, source="unit", meta={"row": 3})
    assert record.prompt_id == PINNED_ID
    assert record.source == "unit" and record.meta == {"row": 3}
    assert record.tools is not None and record.tools[0]["function"]["name"] == "run_shell"


def _last_source_role(row: dict[str, Any]) -> str:
    last = (row.get("messages") or row["conversations"])[-1]
    return str(last.get("role") or last.get("from"))


def test_bundled_samples_all_normalize_to_distinct_prompts() -> None:
    rows = [row for _, row in iter_rows(SourceSpec(str(bundled_sample_path())))]
    assert 35 <= len(rows) <= 60
    dict_rows = [row for row in rows if isinstance(row, dict)]
    assert len(dict_rows) == len(rows)
    ids = set()
    for row in dict_rows:
        messages, tools = normalize_conversation(row)
        validate_prompt_messages(messages, tools)
        ids.add(prompt_id(messages, tools))
    assert len(ids) == len(rows)
    # the variety the samples promise
    assert sum("conversations" in row for row in dict_rows) >= 5
    assert sum(bool(row.get("tools")) for row in dict_rows) >= 8
    assert sum(_last_source_role(row) in ("assistant", "gpt") for row in dict_rows) >= 4
    assert sum(_last_source_role(row) in ("tool", "observation") for row in dict_rows) >= 5
