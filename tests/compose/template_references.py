"""Writes tests/compose/template_references.json: conversations rendered by the REAL chat
templates, the reference the shipped templates (compose/assets/templates) are compared with.

The real files are not in this repository (they belong to their authors); the copies used
were read from public GitHub mirrors:

- Qwen3.6: Qwen/Qwen3.6-27B chat_template.jinja (two independent copies agree);
- Kimi K2.6: K2.5's chat_template.jinja with K2.6's `preserve_thinking` switch (the only
  template change from K2.5 to K2.6), as vendored by radixark/miles
  (miles/utils/chat_template_utils/templates/kimi_k25_fixed.jinja);
- tool_declaration_ts.py of Kimi K2.5/K2.6 (tinker-cookbook's verbatim copy,
  tinker_cookbook/renderers/kimi_k2_5_tool_declaration_ts.py).

Kimi is rendered as its remote code does: tools key-sorted, `tools_ts_str` from the real
encoder, `thinking=True` and `preserve_thinking=False` unless given.

    python tests/compose/template_references.py REAL_QWEN36.jinja REAL_KIMI_K26.jinja \\
        REAL_TOOL_DECLARATION_TS.py
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_suffix(".json")

WEATHER = {
    "name": "get_weather",
    "description": "Get the weather\nfor a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name", "minLength": 1},
            "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
            "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1},
        },
        "required": ["city"],
    },
}
SHELL = {
    "name": "run_shell",
    "description": "Run a command",
    "parameters": {
        "type": "object",
        "properties": {
            "argv": {
                "type": "array",
                "items": {"type": "string", "description": "one argument"},
                "minItems": 1,
            },
            "env": {"type": "object", "additionalProperties": {"type": "string"}},
            "timeout": {"anyOf": [{"type": "number"}, {"type": "null"}]},
            "mode": {"type": ["string", "null"], "enum": ["fast", None]},
            "flags": {"type": ["boolean", "integer", "null"]},
            "opts": {
                "type": "object",
                "description": "options",
                "properties": {"cwd": {"type": "string"}, "shell": {"type": "boolean"}},
                "required": ["cwd"],
                "additionalProperties": False,
            },
            "tags": {"type": "array"},
            "anything": {},
            "limits": {"type": "array", "items": {"$ref": "#/$defs/Limit"}},
        },
        "required": ["argv"],
        "$defs": {
            "Limit": {
                "type": "object",
                "description": "A resource limit",
                "properties": {"name": {"type": "string"}, "value": {"type": "number"}},
                "required": ["name", "value"],
            }
        },
    },
}
TREE = {
    "name": "walk",
    "parameters": {
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#"}}, "id": {}},
        "required": ["id"],
    },
}
NO_PARAMS = {"name": "ping", "description": "Ping"}
BAD_ENUM = {
    "name": "bad",
    "parameters": {"type": "object", "properties": {"x": {"type": "string", "enum": [1]}}},
}


def wrapped(*functions: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": f} for f in functions]


def dumped(*functions: dict[str, Any]) -> list[dict[str, Any]]:
    """As SGLang hands tools to the template: each function's pydantic dump."""
    return [
        {
            "description": f.get("description"),
            "name": f["name"],
            "parameters": f.get("parameters"),
            "strict": False,
        }
        for f in functions
    ]


def call(call_id: str | None, name: str, arguments: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        out["id"] = call_id
    return out


ARGS = {
    "city": "Paris",
    "n": 3,
    "ratio": 0.5,
    "big": 1e20,
    "ok": True,
    "no": False,
    "none": None,
    "list": [1, "a", None],
    "obj": {"k": "é", "n": [True]},
    "text": "two\nlines",
}

AGENT = [
    {"role": "system", "content": "  You are terse.  "},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "  Use the tool. ",
        "tool_calls": [call("call_1", "get_weather", ARGS)],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": " 21C "},
    {
        "role": "assistant",
        "content": "Checking twice.",
        "reasoning_content": "Again.",
        "tool_calls": [
            call("functions.get_weather:2", "get_weather", {"city": "Rome"}),
            call("call_3", "run_shell", {"argv": ["ls", "-l"]}),
        ],
    },
    {"role": "tool", "tool_call_id": "functions.get_weather:2", "content": "rain"},
]
MEDIA = [
    {"type": "text", "text": "Look: "},
    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    {"type": "video", "video": "v.mp4"},
    {"type": "text", "text": " ok?"},
]
CHAT = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!", "reasoning_content": "Greeting."},
    {"role": "user", "content": [{"type": "text", "text": t} for t in ("and ", "you?")]},
    {"role": "assistant", "content": "<think>\nhidden\n</think>\n\n  Fine. "},
    {"role": "user", "content": "Bye", "name": "bob"},
]


def qwen_cases() -> list[dict[str, Any]]:
    decoded = copy.deepcopy(AGENT)  # the Qwen templates take arguments as a mapping
    cases: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": "hi"}], "kwargs": {}},
        {"messages": [{"role": "user", "content": "hi"}], "kwargs": {"enable_thinking": False}},
        {"messages": AGENT[:2], "tools": dumped(WEATHER, SHELL), "kwargs": {}},
        {"messages": AGENT[1:2], "tools": wrapped(WEATHER), "kwargs": {}},
        {"messages": decoded, "tools": dumped(WEATHER, SHELL), "kwargs": {}},
        {
            "messages": decoded,
            "tools": dumped(WEATHER, SHELL),
            "kwargs": {"preserve_thinking": True},
        },
        {"messages": CHAT, "kwargs": {}},
        {"messages": CHAT, "kwargs": {"preserve_thinking": True}},
        {
            "messages": [*CHAT, {"role": "assistant", "content": "ok", "reasoning_content": ""}],
            "kwargs": {"add_generation_prompt": False},
        },
        {
            "messages": [
                {"role": "user", "content": "<tool_response>\nx\n</tool_response>"},
                {"role": "user", "content": "real question"},
                {"role": "assistant", "content": "a", "tool_calls": [call("c", "ping", {})]},
                {"role": "tool", "tool_call_id": "c", "content": "pong"},
                {"role": "user", "content": "<tool_response>\nmore\n</tool_response>"},
            ],
            "kwargs": {},
        },
        {"messages": [{"role": "user", "content": MEDIA}], "kwargs": {}},
        {"messages": [{"role": "user", "content": MEDIA}], "kwargs": {"add_vision_id": True}},
        {"messages": [{"role": "system", "content": "only"}], "kwargs": {}},
        {"messages": [CHAT[0], {"role": "system", "content": "late"}], "kwargs": {}},
        {"messages": [{"role": "robot", "content": "beep"}, CHAT[0]], "kwargs": {}},
    ]
    for case in cases:
        case["kwargs"].setdefault("add_generation_prompt", True)
    return cases


def kimi_cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": "hi"}], "kwargs": {}},
        {"messages": [{"role": "user", "content": "hi"}], "kwargs": {"thinking": False}},
        {"messages": AGENT[:2], "tools": dumped(WEATHER, SHELL), "kwargs": {}},
        {"messages": AGENT[:2], "tools": wrapped(WEATHER, SHELL, TREE, NO_PARAMS), "kwargs": {}},
        {"messages": AGENT[1:2], "tools": wrapped(BAD_ENUM), "kwargs": {}},
        {"messages": AGENT, "tools": wrapped(WEATHER, SHELL), "kwargs": {}},
        {"messages": AGENT, "tools": wrapped(WEATHER), "kwargs": {"preserve_thinking": True}},
        {"messages": CHAT, "kwargs": {}},
        {"messages": CHAT, "kwargs": {"preserve_thinking": True}},
        {"messages": CHAT, "kwargs": {"thinking": False}},
        {"messages": [{"role": "user", "content": MEDIA}], "kwargs": {}},
        {
            "messages": [
                CHAT[0],
                {"role": "assistant", "content": "", "tool_calls": [call(None, "ping", "{}")]},
                {"role": "tool", "content": "pong"},
                {"role": "assistant", "content": "x", "reasoning_content": None},
            ],
            "kwargs": {"add_generation_prompt": False},
        },
    ]
    for case in cases:
        case["kwargs"].setdefault("add_generation_prompt", True)
    return cases


def typescript_cases() -> list[list[dict[str, Any]]]:
    return [
        wrapped(WEATHER),
        wrapped(SHELL),
        wrapped(TREE),
        wrapped(NO_PARAMS),
        wrapped(BAD_ENUM),
        dumped(WEATHER),
        [*wrapped(WEATHER), {"type": "_plugin", "name": "x"}],
    ]


def render(tokenizer: Any, case: dict[str, Any], call: Any) -> dict[str, Any]:
    try:
        return {"text": call(tokenizer, case)}
    except Exception as err:
        return {"error": type(err).__name__}


def main(argv: list[str]) -> int:
    from transformers import AutoTokenizer, PreTrainedTokenizerBase

    from compose.tiny_tokenizers import build_kimi_k26_tokenizer, build_qwen36_tokenizer

    qwen_template, kimi_template = (Path(p).read_text() for p in argv[:2])
    spec = importlib.util.spec_from_file_location("real_tool_declaration_ts", argv[2])
    assert spec and spec.loader
    real_ts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real_ts)

    def sort(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: sort(v) for k, v in sorted(obj.items())}
        return [sort(v) for v in obj] if isinstance(obj, list) else obj

    def qwen_call(tokenizer: Any, case: dict[str, Any]) -> str:
        text = tokenizer.apply_chat_template(
            case["messages"], tools=case.get("tools"), tokenize=False, **case["kwargs"]
        )
        return str(text)

    def kimi_call(tokenizer: Any, case: dict[str, Any]) -> str:
        kwargs = {"thinking": True, "preserve_thinking": False, **case["kwargs"]}
        tools = sort(case.get("tools"))
        if tools:
            with contextlib.suppress(Exception):  # as the real remote code
                kwargs["tools_ts_str"] = real_ts.encode_tools_to_typescript_style(tools)
        text = PreTrainedTokenizerBase.apply_chat_template(
            tokenizer, case["messages"], tools=tools, tokenize=False, **kwargs
        )
        return str(text)

    with tempfile.TemporaryDirectory() as tmp:
        qwen = AutoTokenizer.from_pretrained(build_qwen36_tokenizer(Path(tmp) / "q"))
        kimi = AutoTokenizer.from_pretrained(
            build_kimi_k26_tokenizer(Path(tmp) / "k"), trust_remote_code=True
        )
        qwen.chat_template, kimi.chat_template = qwen_template, kimi_template
        out = {
            "qwen36": [{**c, **render(qwen, c, qwen_call)} for c in qwen_cases()],
            "kimi_k26": [{**c, **render(kimi, c, kimi_call)} for c in kimi_cases()],
            "typescript": [],
        }
        for tools in typescript_cases():
            try:
                out["typescript"].append(
                    {"tools": tools, "text": real_ts.encode_tools_to_typescript_style(tools)}
                )
            except Exception as err:
                out["typescript"].append({"tools": tools, "error": type(err).__name__})
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
