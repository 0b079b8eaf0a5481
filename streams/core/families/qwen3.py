"""Qwen3 / Qwen3.5 / Qwen3.6: `<|im_start|>{role}\\n…<|im_end|>\\n` turns.

Tool calls (`--tool-call-parser qwen3_coder`):
  <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from streams.core.families.base import (
    FamilyProfile,
    FormatError,
    Message,
    ToolCall,
    TurnFormat,
    function_of,
    in_reasoning,
    turn_parts,
)

TOOL_CALL = "<tool_call>"

# Qwen3CoderDetector's non-streaming patterns: a parameter also ends at the next parameter or
# at </function>, a function at the end of the text
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FUNCTION = re.compile(r"<function=(.*?)</function>|<function=(.*)$", re.DOTALL)
_PARAMETER = re.compile(
    r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|$)", re.DOTALL
)
_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
_INT_TYPES = ("int", "uint", "long", "short", "unsigned")


@dataclass(frozen=True)
class QwenFormat(TurnFormat):
    @property
    def tool_start(self) -> str | None:
        return TOOL_CALL

    def prepare(self, message: Message) -> Message:
        """The template prints tool-call arguments as a mapping: the JSON string is decoded."""
        calls = message.get("tool_calls")
        if not calls:
            return message
        return {**message, "tool_calls": [_decoded_arguments(call) for call in calls]}

    def turn(
        self,
        profile: FamilyProfile,
        generated: Message,
        *,
        finished: bool,
        calls_before: int,
        thinking: bool,
    ) -> str | None:
        """`{reasoning}\\n</think>\\n\\n{content}<tool_call>…<|im_end|>`; with thinking off the
        prompt closed the think block: `{content}<tool_call>…<|im_end|>`, as written.

        SGLang's reasoning parser splits the output at `</think>` and strips nothing, so its
        content starts with the newlines the model wrote after `</think>` and its reasoning ends
        with the one before: such a turn is the model's text verbatim (whitespace, an empty or
        absent reasoning, `</think>` in the content, all as written). A trimmed record (older
        servers strip, datasets) gets the template's separators and trimming instead.
        """
        reasoning, content, finished = turn_parts(generated, finished)
        head = "" if profile.prefills_think else profile.think_open + "\n"
        close = profile.think_close
        verbatim = content.startswith("\n")
        if not thinking:
            # a parser that forced reasoning on it put the model's text in the reasoning
            content = (reasoning or "") + content
            # the separator before a tool call is in the content unless a server trimmed it
            verbatim = content.endswith("\n")
            text = content
        elif in_reasoning(content, generated, finished):
            return head + (reasoning or "")
        elif verbatim:
            text = head + (reasoning or "") + close + content
        else:
            content = content.strip()
            if reasoning is None and close in content:
                # the template splits an inline think block out of the content
                parts = content.split(close)
                reasoning = parts[0].split(profile.think_open)[-1]
                content = parts[-1].lstrip("\n")
            text = head + (reasoning or "").strip() + f"\n{close}\n\n" + content
        for position, call in enumerate(generated.get("tool_calls") or []):
            function = function_of(call)
            if position:
                text += "\n"
            elif content.strip() and not verbatim:  # a verbatim content holds its separator
                text += "\n\n"
            text += f"<tool_call>\n<function={function.get('name', '')}>\n"
            arguments = function.get("arguments") or {}
            for name, value in arguments.items():
                value_text = value_text_of(value, profile.tool_args_json)
                text += f"<parameter={name}>\n{value_text}\n</parameter>\n"
            text += "</function>\n</tool_call>"
        return text + (profile.end_of_turn if finished else "")

    def parse_calls(
        self, text: str, tools: list[dict[str, Any]], history_calls: int
    ) -> tuple[str, list[ToolCall]]:
        """Qwen3CoderDetector.detect_and_parse: every function of every `<tool_call>` block;
        the text before the first block is the content."""
        start = text.find(TOOL_CALL)
        if start < 0:
            return text, []
        # function dicts, or SGLang's {"type", "function"} tool dumps (streams/core/serving/)
        functions = [t.get("function", t) for t in tools]
        schemas = {f.get("name"): f.get("parameters") for f in functions}
        calls: list[ToolCall] = []
        for block in _CALL.findall(text):
            for closed, open_ in _FUNCTION.findall(block):
                body = closed or open_
                if ">" not in body:
                    continue
                name, params = body.split(">", 1)
                properties = _properties(schemas.get(name))
                args: dict[str, Any] = {}
                for match in _PARAMETER.findall(params):
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

    def write_calls(self, calls: list[tuple[str, dict[str, Any]]], first_index: int) -> str:
        blocks = []
        for name, args in calls:
            params = "".join(
                f"<parameter={key}>\n{value_text_of(value, True)}\n</parameter>\n"
                for key, value in args.items()
            )
            blocks.append(f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
        return "\n".join(blocks)

    def think_texts(self, profile: FamilyProfile) -> tuple[str, str]:
        """Qwen writes "<think>\\nreasoning\\n</think>\\n\\nanswer"."""
        return profile.think_open + "\n", f"\n{profile.think_close}\n\n"


def value_text_of(value: Any, as_json: bool) -> str:
    """As the template prints an argument: a string as is; anything else as JSON (Qwen3.6's
    `tojson`: `true`, `null`, `3`), or with Qwen3.5's `| string` (Python's str(): `True`,
    `None`) unless it is a mapping or a list."""
    if isinstance(value, str):
        return value
    if as_json or isinstance(value, Mapping | list | tuple):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _decoded_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    function = function_of(call)
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as err:
            raise FormatError("bad_tool_arguments", f"arguments are not JSON: {err}") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise FormatError("bad_tool_arguments", "arguments are not a JSON object")
    decoded = {**function, "arguments": dict(arguments)}
    return {**call, "function": decoded} if "function" in call else decoded


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


def _arguments_style(profile: FamilyProfile, template: str) -> FamilyProfile:
    """Qwen3.5 tests for a mapping or list first and prints other arguments with `| string`
    (`True`, `None`); Qwen3.6 prints them as JSON."""
    return replace(profile, tool_args_json="args_value is mapping" not in template)


FAMILY = FamilyProfile(
    name="qwen3",
    thinking_kwarg="enable_thinking",
    end_of_turn="<|im_end|>",
    prefills_think=True,
    preserve_thinking=True,
    reasoning_parser="qwen3",
    tool_call_parser="qwen3_coder",
    format=QwenFormat(),
    template_markers=("<|im_start|>", "<|im_end|>"),
    model_markers=("qwen",),
    refine=_arguments_style,
)
