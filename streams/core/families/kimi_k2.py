"""Kimi K2 (K2-Thinking, K2.5, K2.6): `<|im_assistant|>assistant<|im_middle|>…<|im_end|>` turns.

Tool calls (`--tool-call-parser kimi_k2`):
  <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>
  {json}<|tool_call_end|>...<|tool_calls_section_end|>
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streams.core.families.base import (
    FamilyProfile,
    Message,
    ToolCall,
    TurnFormat,
    function_of,
    in_reasoning,
    turn_parts,
)

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"

_CALL = re.compile(
    r"<\|tool_call_begin\|>\s*(?P<id>[\w\.]+:\d+)\s*<\|tool_call_argument_begin\|>\s*"
    r"(?P<args>\{.*?\})\s*<\|tool_call_end\|>",
    re.DOTALL,
)


@dataclass(frozen=True)
class KimiFormat(TurnFormat):
    """The think tags bare (the defaults), its own tool-call section."""

    @property
    def tool_start(self) -> str | None:
        return SECTION_BEGIN

    def turn(
        self,
        profile: FamilyProfile,
        generated: Message,
        *,
        finished: bool,
        calls_before: int,
        thinking: bool,
    ) -> str | None:
        """`{reasoning}</think>{content}<|tool_calls_section_begin|>…<|im_end|>` (K2.5/K2.6);
        with thinking off the prompt closed the think block: `{content}…<|im_end|>`."""
        reasoning, content, finished = turn_parts(generated, finished)
        head = "" if profile.prefills_think else profile.think_open
        if not thinking:
            # a parser that forced reasoning on it put the model's text in the reasoning
            text = (reasoning or "") + content
        elif in_reasoning(content, generated, finished):
            return head + (reasoning or "")
        else:
            text = head + (reasoning or "") + profile.think_close + content
        calls = generated.get("tool_calls") or []
        if calls:
            text += SECTION_BEGIN
            for index, call in enumerate(calls, start=calls_before):
                function = function_of(call)
                arguments = function.get("arguments", "")
                if not isinstance(arguments, str):
                    arguments = json.dumps(arguments, ensure_ascii=False)
                text += (
                    f"<|tool_call_begin|>{_call_id(call, function, index)}"
                    f"<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"
                )
            text += SECTION_END
        return text + (profile.end_of_turn if finished else "")

    def parse_calls(
        self, text: str, tools: list[dict[str, Any]], history_calls: int
    ) -> tuple[str, list[ToolCall]]:
        start = text.find(SECTION_BEGIN)
        if start < 0:
            return text, []
        calls: list[ToolCall] = []
        for match in _CALL.finditer(text, start):
            model_id = match.group("id")
            name = model_id.split(".", 1)[-1].split(":", 1)[0]
            # SGLang rewrites the id from the history count, whatever index the model wrote.
            call_id = f"functions.{name}:{history_calls + len(calls)}"
            calls.append(ToolCall(call_id, name, match.group("args")))
        if not calls:
            return text, []
        return text[:start], calls

    def write_calls(self, calls: list[tuple[str, dict[str, Any]]], first_index: int) -> str:
        parts = [
            f"<|tool_call_begin|>functions.{name}:{first_index + i}<|tool_call_argument_begin|>"
            f"{json.dumps(args, ensure_ascii=False)}<|tool_call_end|>"
            for i, (name, args) in enumerate(calls)
        ]
        return SECTION_BEGIN + "".join(parts) + SECTION_END


def _call_id(call: Mapping[str, Any], function: Mapping[str, Any], index: int) -> str:
    """The id as given, as the K2.5/K2.6 template prints it (SGLang's parser gives every call
    one); a call without an id gets `functions.{name}:{index}`, as normalization gives them."""
    given = call.get("id")
    if isinstance(given, str) and given:
        return given
    return f"functions.{function.get('name', '')}:{index}"


FAMILY = FamilyProfile(
    name="kimi_k2",
    thinking_kwarg="thinking",
    end_of_turn="<|im_end|>",
    prefills_think=True,
    preserve_thinking=True,
    reasoning_parser="kimi_k2",
    tool_call_parser="kimi_k2",
    format=KimiFormat(),
    template_markers=("<|im_assistant|>", "<|im_middle|>"),
    model_markers=("kimi",),
)
