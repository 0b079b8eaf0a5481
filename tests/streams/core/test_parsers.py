"""SGLang's qwen3_coder tool-call parsing: typed arguments converted as its detector does."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streams.core.parsers import parse

TOOLS = [
    {
        "name": "f",
        "parameters": {
            "type": "object",
            "properties": {
                "s": {"type": "string"},
                "i": {"type": "integer"},
                "n": {"type": "number"},
                "b": {"type": "boolean"},
                "o": {"type": "object"},
                "a": {"type": "array"},
                "u": {"type": ["string", "null"]},
                "untyped": {},
            },
        },
    }
]


def call(**params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function=f>\n{body}</function>\n</tool_call>"


@pytest.mark.parametrize(
    ("name", "raw", "value"),
    [
        ("s", "42", "42"),
        ("s", "line one\nline two", "line one\nline two"),
        ("s", "null", None),  # null is None whatever the type
        ("i", "3", 3),
        ("i", "3.5", "3.5"),  # not an integer: stays text
        ("n", "2", 2),
        ("n", "2.0", 2.0),
        ("n", "2.5", 2.5),
        ("b", "true", True),
        ("b", "False", False),
        ("b", "yes", False),
        ("o", '{"k": [1, 2]}', {"k": [1, 2]}),
        ("a", '["x", 1]', ["x", 1]),
        ("u", "abc", "abc"),
        ("u", "null", None),
        ("untyped", "7", "7"),  # no type: a string
        ("unknown", "7", "7"),  # not in the schema: the text
    ],
)
def test_qwen_arguments_are_converted_as_sglang_does(name: str, raw: str, value: Any) -> None:
    content, calls = parse("qwen3", "Sure.\n\n" + call(**{name: raw}), TOOLS, 0)
    assert content == "Sure.\n\n"
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {name: value})]


def test_qwen_several_calls_and_an_unclosed_parameter() -> None:
    text = (
        call(s="a")
        + "\n"
        + "<tool_call>\n<function=f>\n<parameter=i>\n5\n</function>\n</tool_call>"
    )
    content, calls = parse("qwen3", text, TOOLS, 0)
    assert content == ""
    assert [json.loads(c.arguments) for c in calls] == [{"s": "a"}, {"i": 5}]
