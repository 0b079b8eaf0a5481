"""SGLang's output parsers, non-streaming: the reasoning split and each family's tool calls.

The emulated server answers with them (compose/emulator/) and the generate worker splits the
output of native `/generate` requests with them (streams/generate/native.py), so both read an
output the way SGLang's chat endpoint does.

Kimi K2 (`--tool-call-parser kimi_k2`):
  <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>
  {json}<|tool_call_end|>...<|tool_calls_section_end|>
Qwen3 coder (`--tool-call-parser qwen3_coder`):
  <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

KIMI_SECTION_BEGIN = "<|tool_calls_section_begin|>"
KIMI_SECTION_END = "<|tool_calls_section_end|>"
QWEN_TOOL_CALL = "<tool_call>"

_KIMI_CALL = re.compile(
    r"<\|tool_call_begin\|>\s*(?P<id>[\w\.]+:\d+)\s*<\|tool_call_argument_begin\|>\s*"
    r"(?P<args>\{.*?\})\s*<\|tool_call_end\|>",
    re.DOTALL,
)
# Qwen3CoderDetector's non-streaming patterns: a parameter also ends at the next parameter or
# at </function>, a function at the end of the text
_QWEN_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_QWEN_FUNCTION = re.compile(r"<function=(.*?)</function>|<function=(.*)$", re.DOTALL)
_QWEN_PARAMETER = re.compile(
    r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|$)", re.DOTALL
)
_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
_INT_TYPES = ("int", "uint", "long", "short", "unsigned")


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the OpenAI API carries it

    def to_openai(self, index: int) -> dict[str, Any]:
        return {
            "id": self.id,
            "index": index,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def tool_start_token(family: str) -> str | None:
    return {"kimi_k2": KIMI_SECTION_BEGIN, "qwen3": QWEN_TOOL_CALL}.get(family)


def split_reasoning(
    text: str,
    think_open: str,
    think_close: str,
    force_reasoning: bool,
    tool_start: str | None = None,
) -> tuple[str, str]:
    """(reasoning, content) of a decoded output; no whitespace is stripped.

    `force_reasoning` is SGLang's flag for templates that prefill `<think>`: the output is
    reasoning until `</think>` even though it never opens the block itself.
    """
    if not (force_reasoning or think_open in text):
        return "", text
    body = text
    while body.startswith(think_open):
        body = body[len(think_open) :]
    if think_close in body:
        reasoning, content = body.split(think_close, 1)
        return reasoning, content
    # A tool-call section may start before </think> (Kimi K2, Qwen3.5+): it ends the reasoning.
    if tool_start and tool_start in body:
        index = body.index(tool_start)
        return body[:index], body[index:]
    # No </think>: the output was cut (or the model never closed it); all of it is reasoning.
    return body, ""


def parse(
    family: str, text: str, tools: list[dict[str, Any]], history_calls: int
) -> tuple[str, list[ToolCall]]:
    """(normal text, calls) as the family's SGLang detector returns them; no calls leaves text."""
    if family == "kimi_k2":
        return _parse_kimi(text, history_calls)
    if family == "qwen3":
        return _parse_qwen(text, tools)
    return text, []


def _parse_kimi(text: str, history_calls: int) -> tuple[str, list[ToolCall]]:
    start = text.find(KIMI_SECTION_BEGIN)
    if start < 0:
        return text, []
    calls: list[ToolCall] = []
    for match in _KIMI_CALL.finditer(text, start):
        model_id = match.group("id")
        name = model_id.split(".", 1)[-1].split(":", 1)[0]
        # SGLang rewrites the id from the history count, whatever index the model wrote.
        call_id = f"functions.{name}:{history_calls + len(calls)}"
        calls.append(ToolCall(call_id, name, match.group("args")))
    if not calls:
        return text, []
    return text[:start], calls


def _parse_qwen(text: str, tools: list[dict[str, Any]]) -> tuple[str, list[ToolCall]]:
    """Qwen3CoderDetector.detect_and_parse: every function of every `<tool_call>` block; the
    text before the first block is the content."""
    start = text.find(QWEN_TOOL_CALL)
    if start < 0:
        return text, []
    # function dicts, or SGLang's {"type", "function"} tool dumps (streams/core/serving.py)
    functions = [t.get("function", t) for t in tools]
    schemas = {f.get("name"): f.get("parameters") for f in functions}
    calls: list[ToolCall] = []
    for block in _QWEN_CALL.findall(text):
        for closed, open_ in _QWEN_FUNCTION.findall(block):
            body = closed or open_
            if ">" not in body:
                continue
            name, params = body.split(">", 1)
            properties = _properties(schemas.get(name))
            args: dict[str, Any] = {}
            for match in _QWEN_PARAMETER.findall(params):
                if ">" not in match:
                    continue
                key, raw = match.split(">", 1)
                args[key] = _convert(_strip_one_newline(raw), key, properties)
            arguments = json.dumps(args, ensure_ascii=False)
            digest = hashlib.sha256(f"{len(calls)}:{name}:{arguments}".encode()).hexdigest()
            calls.append(ToolCall(f"call_{digest[:24]}", name, arguments))
    if not calls:
        return text, []
    return text[:start], calls


def _properties(parameters: Any) -> dict[str, Any]:
    """The detector's argument config: the schema's properties (or the schema itself)."""
    if not isinstance(parameters, dict):
        return {}
    properties = parameters.get("properties", parameters)
    return properties if isinstance(properties, dict) else {}


def _strip_one_newline(raw: str) -> str:
    raw = raw[1:] if raw.startswith("\n") else raw
    return raw[:-1] if raw.endswith("\n") else raw


def _convert(raw: str, name: str, properties: dict[str, Any]) -> Any:
    """Parameter text to a JSON value by the schema's type, as Qwen3CoderDetector's
    _convert_param_value: `null` is None whatever the type, an unknown parameter stays text,
    a value that does not convert stays text (a boolean that is not `true` is False)."""
    if raw.lower() == "null":
        return None
    if name not in properties:
        return raw
    schema = properties[name]
    kind = "string"
    if isinstance(schema, dict) and "type" in schema:
        kind = str(schema["type"]).strip().lower()
    if kind in _STRING_TYPES:
        return raw
    if kind.startswith(_INT_TYPES):
        try:
            return int(raw)
        except ValueError:
            return raw
    if kind.startswith(("num", "float")):
        try:
            number = float(raw)
        except ValueError:
            return raw
        integral = "." not in raw and "e" not in raw.lower() and number.is_integer()
        return int(number) if integral else number
    if kind in ("boolean", "bool", "binary"):
        return raw.lower() == "true"
    if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
        try:
            return json.loads(raw)
        except ValueError:
            pass
    try:
        return ast.literal_eval(raw)
    except Exception:  # anything literal_eval cannot read stays text, as in SGLang
        return raw
