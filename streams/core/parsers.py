"""SGLang's output parsers, non-streaming: the reasoning split, and each family's tool calls.

The emulated server answers with them (compose/emulator/) and the generate worker splits the
output of native `/generate` requests with them (streams/generate/native.py), so both read an
output the way SGLang's chat endpoint does. The tool-call formats live with their families
(streams/core/families/); `parse` and `tool_start_token` ask the family.
"""

from __future__ import annotations

from typing import Any

from streams.core.families import FAMILIES, GENERIC, FamilyProfile, ToolCall

__all__ = ["ToolCall", "parse", "split_reasoning", "tool_start_token"]


def _family(family: str | FamilyProfile) -> FamilyProfile:
    if isinstance(family, FamilyProfile):
        return family
    return FAMILIES.get(family, GENERIC)


def tool_start_token(family: str | FamilyProfile) -> str | None:
    return _family(family).tool_start


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
    family: str | FamilyProfile, text: str, tools: list[dict[str, Any]], history_calls: int
) -> tuple[str, list[ToolCall]]:
    """(normal text, calls) as the family's SGLang detector returns them; no calls leaves text."""
    return _family(family).parse_tool_calls(text, tools, history_calls)
