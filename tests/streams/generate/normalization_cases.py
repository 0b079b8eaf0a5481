"""Prompts for the normalization tests (test_normalization*.py): tools in the caller's field
order, tool-call histories with every argument type, and the cases rendered through each
profile."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAMPLES = Path(__file__).parents[3] / "producers" / "samples" / "sample_prompts.jsonl"

WEATHER = {
    "type": "function",
    "function": {
        # not the declared field order: 0.5.23 keeps the caller's
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
        "description": "Weather for a city",
    },
}
QUERY = {
    "type": "function",
    "function": {
        "name": "run_query",
        "description": "Run a query",
        "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}},
        "strict": True,
    },
}
BARE = {"type": "function", "function": {"name": "ping"}}  # no description, no parameters


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, separators=(",", ":"))},
    }


@dataclass(frozen=True)
class Case:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = "auto"


HISTORY = [
    {"role": "user", "content": "Weather in Oslo for 2 days, and run the query?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Two calls.",
        "tool_calls": [
            _call("functions.get_weather:0", "get_weather", {"city": "Oslo", "days": 2}),
            _call(
                "functions.run_query:1",
                "run_query",
                {"sql": "SELECT 1", "limit": 2.5, "fast": True, "tags": ["a"], "x": None},
            ),
        ],
    },
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": '{"t": -3}'},
    {"role": "tool", "tool_call_id": "functions.run_query:1", "content": "1 row"},
]

CASES: dict[str, Case] = {
    "tools": Case([{"role": "user", "content": "Weather in Paris?"}], [WEATHER, QUERY, BARE]),
    "tool_results_typed_arguments": Case(HISTORY, [WEATHER, QUERY]),
    "named_tool_choice": Case(
        [{"role": "user", "content": "Run it."}],
        [WEATHER, QUERY],
        {"type": "function", "function": {"name": "run_query"}},
    ),
    "tool_choice_none": Case([{"role": "user", "content": "No tools."}], [WEATHER], "none"),
    "content_parts": Case(
        [
            {
                "role": "system",
                "content": [{"type": "text", "text": "Be"}, {"type": "text", "text": "terse."}],
            },
            {
                "role": "user",
                "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "B"}],
            },
        ]
    ),
    "tool_content_parts": Case(
        [
            *HISTORY[:3],
            {
                "role": "tool",
                "tool_call_id": "functions.run_query:1",
                "content": [{"type": "text", "text": "1"}, {"type": "text", "text": "row"}],
            },
        ],
        [WEATHER, QUERY],
    ),
    "user_name": Case([{"role": "user", "name": "alice", "content": "Hi"}]),
}
