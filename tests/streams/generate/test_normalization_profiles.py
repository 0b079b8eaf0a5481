"""What each normalization profile (streams/core/serving/) hands the chat template: tool and
message dumps, keyword arguments, per SGLang version (issue 26) and vLLM version (issue 34); the
agreement with the server is test_normalization.py's."""

from __future__ import annotations

from typing import Any

import pytest

from streams.core.serving import (
    NEWEST,
    NEWEST_VLLM,
    PROFILES,
    SGLANG_PROFILES,
    VLLM_PROFILES,
    NormalizationError,
    profile_for_version,
)
from tests.streams.generate.normalization_cases import BARE, HISTORY, QUERY, WEATHER


def test_profile_for_version() -> None:
    assert profile_for_version("0.5.23.post1").name == "sglang-0.5.23"
    assert profile_for_version("v0.6.0rc1").name == "sglang-0.5.23"
    assert profile_for_version("0.5.22").name == "sglang-0.5.11"
    assert profile_for_version("0.5.10").name == "sglang-0.5.10"
    assert profile_for_version("0.5.9").name == "sglang-0.5.9"
    assert profile_for_version("0.4.6.post5").name == "sglang-0.5.1"
    # no version, or none we can read: the newest
    assert profile_for_version(None) is NEWEST
    assert profile_for_version("emulator") is NEWEST
    # vLLM's versions count in vLLM's profiles
    assert profile_for_version("0.34.0", "vllm").name == "vllm-0.33"
    assert profile_for_version("0.32.0", "vllm").name == "vllm-0.30"
    assert profile_for_version("0.29.0", "vllm").name == "vllm-0.29"
    assert profile_for_version("0.21.0", "vllm").name == "vllm-0.20"
    assert profile_for_version("0.19.1", "vllm").name == "vllm-0.12"
    assert profile_for_version("0.10.2", "vllm").name == "vllm-0.11"
    assert profile_for_version(None, "vllm") is NEWEST_VLLM


def test_the_registry_holds_every_profile_each_kind_newest_last() -> None:
    assert list(PROFILES) == [p.name for p in (*SGLANG_PROFILES, *VLLM_PROFILES)]
    assert SGLANG_PROFILES[-1] is NEWEST
    assert VLLM_PROFILES[-1] is NEWEST_VLLM
    assert {p.kind for p in SGLANG_PROFILES} == {"sglang"}
    assert {p.kind for p in VLLM_PROFILES} == {"vllm"}


def test_vllm_hands_the_template_its_own_dumps() -> None:
    """vLLM 0.34: every tool (also for a named or "none" tool_choice) as its models dump it,
    messages rebuilt with a user's `name`, reasoning under both names, arguments parsed (an
    empty one as {}), text parts joined with "\n" (string format) or kept as parts."""
    tools = NEWEST_VLLM.tools([WEATHER, QUERY, BARE], {"function": {"name": "ping"}})
    assert tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": WEATHER["function"]["parameters"],
            },
        },
        {"type": "function", "function": {**QUERY["function"]}},
        {"type": "function", "function": {"name": "ping", "description": None, "parameters": None}},
    ]
    assert list(tools[0]["function"]) == ["name", "description", "parameters"]
    assert NEWEST_VLLM.tools([WEATHER], "none") is not None
    empty = {"id": "c", "type": "function", "function": {"name": "ping", "arguments": ""}}
    history = {**HISTORY[1], "tool_calls": [*HISTORY[1]["tool_calls"], empty]}
    messages = NEWEST_VLLM.messages(
        [{"role": "user", "name": "alice", "content": "Hi"}, history], "string"
    )
    assert messages[0] == {"role": "user", "content": "Hi", "name": "alice"}
    assert messages[1]["reasoning"] == messages[1]["reasoning_content"] == "Two calls."
    calls = messages[1]["tool_calls"]
    assert calls[0]["function"] == {"arguments": {"city": "Oslo", "days": 2}, "name": "get_weather"}
    assert calls[-1]["function"]["arguments"] == {}
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    user = {"role": "user", "content": parts}
    assert NEWEST_VLLM.messages([user], "string")[0]["content"] == "a\nb"
    assert NEWEST_VLLM.messages([{"role": "user", "content": "a"}], "openai")[0]["content"] == [
        {"type": "text", "text": "a"}
    ]
    tool = {"role": "tool", "tool_call_id": "c", "content": parts}
    assert NEWEST_VLLM.messages([tool], "openai")[0]["content"] == "a\nb"
    assert PROFILES["vllm-0.12"].messages([tool], "openai")[0]["content"] == parts
    assert PROFILES["vllm-0.11"].messages([HISTORY[1]])[0].get("reasoning") is None


# -- what each profile hands the template ---------------------------------------------------


def test_tool_dumps_per_version() -> None:
    tools = [WEATHER, BARE]
    assert PROFILES["sglang-0.5.4"].tools(tools) == [
        {
            "description": "Weather for a city",
            "name": "get_weather",
            "parameters": WEATHER["function"]["parameters"],
            "strict": False,
        },
        {"description": None, "name": "ping", "parameters": None, "strict": False},
    ]
    wrapped = PROFILES["sglang-0.5.9"].tools(tools)
    assert wrapped is not None and list(wrapped[0]) == ["type", "function"]
    eleven = PROFILES["sglang-0.5.11"].tools(tools)
    assert eleven is not None and eleven[0]["defer_loading"] is None
    assert list(eleven[0]["function"]) == ["description", "name", "parameters", "strict"]
    newest = NEWEST.tools(tools)
    assert newest == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER["function"]["parameters"],
                "description": "Weather for a city",
            },
            "defer_loading": None,
        },
        {
            "type": "function",
            "function": {"name": "ping", "description": None, "parameters": None},
            "defer_loading": None,
        },
    ]
    assert newest is not None and list(newest[0]["function"]) == [
        "name",
        "parameters",
        "description",
    ]
    assert NEWEST.tools([QUERY])[0]["function"]["strict"] is True  # type: ignore[index]
    assert NEWEST.tools(tools, "none") is None
    named = NEWEST.tools(tools, {"type": "function", "function": {"name": "ping"}})
    assert [t["function"]["name"] for t in named or []] == ["ping"]


def test_message_dumps_per_version() -> None:
    history = HISTORY[1]
    old = PROFILES["sglang-0.5.1"].messages([history])[0]
    assert isinstance(old["tool_calls"][0]["function"]["arguments"], str)
    new = NEWEST.messages([history])[0]
    assert new["tool_calls"][1]["function"]["arguments"] == {
        "sql": "SELECT 1",
        "limit": 2.5,
        "fast": True,
        "tags": ["a"],
        "x": None,
    }
    assert new["tool_calls"][0]["index"] is None  # ToolCall's dump, nested None kept
    assert "tool_call_id" not in new and "name" not in new  # top-level None left out
    # a user message keeps role and content only; None content is ""
    assert NEWEST.messages([{"role": "user", "name": "a", "content": "x"}]) == [
        {"role": "user", "content": "x"}
    ]
    assert NEWEST.messages([{"role": "assistant", "content": None}]) == [
        {"role": "assistant", "content": ""}
    ]
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert NEWEST.messages([{"role": "user", "content": parts}], "string")[0]["content"] == "a b"
    assert NEWEST.messages([{"role": "user", "content": parts}], "openai")[0]["content"] == parts
    tool = {"role": "tool", "tool_call_id": "c", "content": parts}
    assert NEWEST.messages([tool], "openai")[0]["content"] == "a b"
    assert PROFILES["sglang-0.5.10"].messages([tool], "openai")[0]["content"] == parts
    with pytest.raises(NormalizationError):
        NEWEST.messages([{**history, "tool_calls": [_bad_arguments()]}])


def _bad_arguments() -> dict[str, Any]:
    return {"id": "x", "type": "function", "function": {"name": "f", "arguments": "{not json"}}


def test_reasoning_effort_keyword_per_version() -> None:
    assert PROFILES["sglang-0.5.9"].template_kwargs({"thinking": True}) == {
        "reasoning_effort": "medium",
        "thinking": True,
    }
    assert NEWEST.template_kwargs({"thinking": True}) == {"thinking": True}
    assert NEWEST.template_kwargs({}, "high") == {"reasoning_effort": "high"}
