"""Normalization of source rows to canonical OpenAI prompts, validation, and prompt_id."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.sources import SourceSpec, bundled_sample_path, iter_rows
from streams.core.normalize import (
    ERROR_KINDS,
    MESSAGE_KEYS,
    make_prompt_record,
    normalize_conversation,
    normalize_tools,
    prompt_id,
    validate_prompt_messages,
)
from streams.core.records import PromptRecord, RecordError

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def kind_of(raw: Any) -> str:
    with pytest.raises(RecordError) as info:
        normalize_conversation(raw)
    assert info.value.kind in ERROR_KINDS
    return info.value.kind


# --- OpenAI form ---------------------------------------------------------------------------------


def test_openai_form_keeps_known_keys_and_drops_nulls_and_extras() -> None:
    raw = {
        "messages": [
            {"role": "system", "content": "Be brief.", "weight": 0},
            {"role": "user", "content": "Hi", "name": "ana", "tool_calls": None, "loss": 1},
        ],
        "tools": None,
        "id": "row-7",
    }
    messages, tools = normalize_conversation(raw)
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi", "name": "ana"},
    ]
    assert tools is None


def test_trailing_assistant_turns_are_dropped() -> None:
    raw = {
        "messages": [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "A2"},
            {"role": "assistant", "content": "", "tool_calls": [_call("c1", "f", "{}")]},
        ]
    }
    messages, _ = normalize_conversation(raw)
    assert [m["content"] for m in messages] == ["Q1", "A1", "Q2"]


def test_conversation_ending_with_tool_result_is_kept() -> None:
    raw = {
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("c1", "get_weather", "{}")],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        ],
        "tools": [WEATHER_TOOL],
    }
    messages, tools = normalize_conversation(raw)
    assert messages[-1] == {"role": "tool", "content": "rain", "tool_call_id": "c1"}
    assert messages[1]["content"] == ""  # null content beside tool calls becomes ""
    assert tools == [WEATHER_TOOL]


def test_history_reasoning_is_kept_and_vllm_reasoning_field_is_mapped() -> None:
    raw = {
        "messages": [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1", "reasoning": "think"},
            {"role": "user", "content": "Q2"},
        ]
    }
    messages, _ = normalize_conversation(raw)
    assert messages[1] == {"role": "assistant", "content": "A1", "reasoning_content": "think"}


def test_empty_reasoning_and_empty_tool_calls_are_absent() -> None:
    raw = {
        "messages": [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1", "reasoning_content": "", "tool_calls": []},
            {"role": "user", "content": "Q2"},
        ]
    }
    messages, _ = normalize_conversation(raw)
    assert messages[1] == {"role": "assistant", "content": "A1"}


def test_text_parts_are_joined() -> None:
    raw = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ]
    }
    messages, _ = normalize_conversation(raw)
    assert messages == [{"role": "user", "content": "a\nb"}]


def test_tool_call_arguments_objects_become_canonical_json() -> None:
    raw = {
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c1",
                        "function": {
                            "name": "f",
                            "arguments": {"b": [1, {"y": 2, "x": 1}], "a": "é"},
                        },
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "g", "arguments": '{"z": 1}'},
                    },
                    {"id": "c3", "function": {"name": "h"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "1"},
            {"role": "tool", "tool_call_id": "c2", "content": "2"},
            {"role": "tool", "tool_call_id": "c3", "content": "3"},
        ]
    }
    messages, _ = normalize_conversation(raw)
    calls = messages[1]["tool_calls"]
    assert calls[0] == {
        "id": "c1",
        "type": "function",
        "function": {"name": "f", "arguments": '{"a":"é","b":[1,{"x":1,"y":2}]}'},
    }
    assert calls[1]["function"]["arguments"] == '{"z": 1}'  # strings are kept verbatim
    assert calls[2]["function"]["arguments"] == "{}"


def test_missing_ids_are_synthesized_and_matched_in_order() -> None:
    raw = {
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"function": {"name": "f", "arguments": "{}"}},
                    {"name": "g", "arguments": {"k": 1}},  # flattened call
                ],
            },
            {"role": "tool", "content": "f says"},
            {"role": "tool", "content": "g says"},
        ]
    }
    messages, _ = normalize_conversation(raw)
    ids = [call["id"] for call in messages[1]["tool_calls"]]
    assert ids == ["functions.f:0", "functions.g:1"]
    assert [m["tool_call_id"] for m in messages[2:]] == ids


def test_given_ids_are_kept_as_given_and_only_absent_ones_synthesized() -> None:
    """Kimi's K2.5/K2.6 template prints tool-call ids as given: whatever their shape, they are
    never rewritten; a call without one gets `functions.{name}:{index}`."""
    raw = {
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "call_abc", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "functionsexec5", "function": {"name": "g", "arguments": "{}"}},
                    {"function": {"name": "h", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "functionsexec5", "content": "g says"},
            {"role": "tool", "content": "f says"},
            {"role": "tool", "content": "h says"},
        ]
    }
    messages, _ = normalize_conversation(raw)
    ids = [call["id"] for call in messages[1]["tool_calls"]]
    assert ids == ["call_abc", "functionsexec5", "functions.h:2"]
    assert [m["tool_call_id"] for m in messages[2:]] == ["functionsexec5", "call_abc", ids[2]]


def test_tools_as_json_string_and_bare_schemas() -> None:
    bare = WEATHER_TOOL["function"]
    assert normalize_tools(json.dumps([bare])) == [WEATHER_TOOL]
    assert normalize_tools([WEATHER_TOOL]) == [WEATHER_TOOL]
    assert normalize_tools([]) is None
    assert normalize_tools("") is None
    assert normalize_tools(None) is None


# --- ShareGPT form -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source_role", "role"),
    [("human", "user"), ("user", "user"), ("gpt", "assistant"), ("chatgpt", "assistant"),
     ("bing", "assistant"), ("assistant", "assistant"), ("GPT", "assistant")],
)  # fmt: skip
def test_sharegpt_roles(source_role: str, role: str) -> None:
    raw = {
        "conversations": [
            {"from": "human", "value": "first"},
            {"from": source_role, "value": "x"},
            {"from": "human", "value": "last"},
        ]
    }
    messages, _ = normalize_conversation(raw)
    assert messages[1] == {"role": role, "content": "x"}


def test_sharegpt_system_field_and_system_turn() -> None:
    raw = {
        "system": "Be brief.",
        "conversations": [
            {"from": "system", "value": "Also kind."},
            {"from": "human", "value": "Hi"},
        ],
    }
    messages, _ = normalize_conversation(raw)
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Also kind."},
        {"role": "user", "content": "Hi"},
    ]


def test_sharegpt_function_call_and_observation() -> None:
    raw = {
        "conversations": [
            {"from": "human", "value": "Weather in Oslo?"},
            {
                "from": "function_call",
                "value": '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
            },
            {"from": "observation", "value": "rain"},
            {"from": "gpt", "value": "Take an umbrella."},
        ],
        "tools": json.dumps([WEATHER_TOOL["function"]]),
    }
    messages, tools = normalize_conversation(raw)
    assert messages == [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "functions.get_weather:0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                }
            ],
        },
        {"role": "tool", "content": "rain", "tool_call_id": "functions.get_weather:0"},
    ]
    assert tools == [WEATHER_TOOL]


def test_sharegpt_and_openai_forms_give_the_same_prompt() -> None:
    openai = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
                ],
            },
            {"role": "tool", "content": "rain"},
        ],
        "tools": [WEATHER_TOOL],
    }
    sharegpt = {
        "system": "S",
        "conversations": [
            {"from": "human", "value": "Weather in Oslo?"},
            {
                "from": "function_call",
                "value": {"name": "get_weather", "arguments": {"city": "Oslo"}},
            },
            {"from": "function_response", "value": "rain"},
            {"from": "gpt", "value": "Take an umbrella."},
        ],
        "tools": json.dumps([WEATHER_TOOL["function"]]),
    }
    assert normalize_conversation(openai) == normalize_conversation(sharegpt)
    assert prompt_id(*normalize_conversation(openai)) == prompt_id(
        *normalize_conversation(sharegpt)
    )


HUMAN = {"from": "human", "value": "x"}

# --- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ([{"role": "user", "content": "x"}], "bad_shape"),
        ("text", "bad_shape"),
        ({"prompt": "x"}, "bad_shape"),
        ({"messages": "x"}, "bad_shape"),
        ({"messages": ["x"]}, "bad_shape"),
        ({"messages": [{"role": "user", "content": "x", "name": 3}]}, "bad_shape"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}, "bad_shape"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": "[oops"}, "bad_shape"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "x"}]}, "bad_shape"),
        ({"messages": []}, "empty_messages"),
        ({"conversations": []}, "empty_messages"),
        ({"messages": [{"role": "narrator", "content": "x"}]}, "unknown_role"),
        ({"messages": [{"content": "x"}]}, "unknown_role"),
        ({"conversations": [{"from": "bot", "value": "x"}]}, "unknown_role"),
        ({"messages": [{"role": "user", "content": 3}]}, "non_string_content"),
        ({"messages": [{"role": "user", "content": None}]}, "non_string_content"),
        ({"messages": [{"role": "user", "content": {"text": "x"}}]}, "non_string_content"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         "non_string_content"),
        ({"conversations": [{"from": "human", "value": "x"}], "system": 1}, "non_string_content"),
        ({"messages": [{"role": "system", "content": "x"}]}, "no_user_turn"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, "no_user_turn"),
        ({"system": "x", "conversations": []}, "no_user_turn"),
        ({"conversations": [HUMAN, {"from": "observation", "value": "y"}]}, "missing_tool_call_id"),
        ({"conversations": [HUMAN, {"from": "function_call", "value": "{"}]}, "bad_tool_call"),
        ({"messages": [{"role": "user", "content": "x"},
                       {"role": "assistant", "content": "", "tool_calls": [{"function": {}}]},
                       {"role": "tool", "content": "r"}]}, "bad_tool_call"),
        ({"messages": [{"role": "user", "content": "x"},
                       {"role": "assistant", "content": "", "tool_calls": {"id": "c"}},
                       {"role": "tool", "content": "r"}]}, "bad_tool_call"),
        ({"messages": [{"role": "user", "content": "x"},
                       {"role": "assistant", "content": "",
                        "tool_calls": [{"function": {"name": "f", "arguments": [1]}}]},
                       {"role": "tool", "content": "r"}]}, "bad_tool_call"),
    ],
)  # fmt: skip
def test_error_kinds(raw: Any, kind: str) -> None:
    assert kind_of(raw) == kind


# --- validate_prompt_messages --------------------------------------------------------------------


def _call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    ("messages", "kind"),
    [
        ("x", "bad_shape"),
        ([], "empty_messages"),
        (["x"], "bad_shape"),
        ([{"role": "human", "content": "x"}], "unknown_role"),
        ([{"role": ["user"], "content": "x"}], "unknown_role"),
        ([{"role": "user", "content": None}], "non_string_content"),
        ([{"role": "user", "content": [{"type": "text", "text": "x"}]}], "non_string_content"),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
         "ends_with_assistant"),
        ([{"role": "system", "content": "x"}], "no_user_turn"),
        ([{"role": "user", "content": "x"}, {"role": "tool", "content": "r"}],
         "missing_tool_call_id"),
        ([{"role": "user", "content": "x"},
          {"role": "assistant", "content": "", "tool_calls": [_call("c", "f", {"a": 1})]},
          {"role": "tool", "tool_call_id": "c", "content": "r"}], "bad_tool_call"),
        ([{"role": "user", "content": "x"},
          {"role": "assistant", "content": "", "tool_calls": [_call("c", "", "{}")]},
          {"role": "tool", "tool_call_id": "c", "content": "r"}], "bad_tool_call"),
        ([{"role": "user", "content": "x", "tool_calls": [_call("c", "f", "{}")]}],
         "bad_tool_call"),
    ],
)  # fmt: skip
def test_validate_prompt_messages_kinds(messages: Any, kind: str) -> None:
    with pytest.raises(RecordError) as info:
        validate_prompt_messages(messages)
    assert info.value.kind == kind


def test_validate_accepts_a_prompt_ending_with_a_tool_result() -> None:
    validate_prompt_messages(
        [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "", "tool_calls": [_call("c", "f", "{}")]},
            {"role": "tool", "tool_call_id": "c", "content": "r"},
        ]
    )


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
