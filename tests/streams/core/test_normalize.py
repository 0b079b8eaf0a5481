"""Normalization of source rows to canonical OpenAI prompts, validation, and prompt_id."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streams.core.normalize import (
    ERROR_KINDS,
    normalize_conversation,
    normalize_tools,
    prompt_id,
    validate_prompt_messages,
)
from streams.core.records import RecordError

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
