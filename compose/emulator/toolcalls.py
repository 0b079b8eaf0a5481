"""Tool calls in each family's wire format, as the emulated model writes them; SGLang's parsing
of them back is streams/core/parsers.py."""

from __future__ import annotations

import json
from typing import Any

from streams.core.parsers import KIMI_SECTION_BEGIN, KIMI_SECTION_END, parse, tool_start_token

__all__ = ["parse", "render", "tool_start_token"]


def render(family: str, calls: list[tuple[str, dict[str, Any]]], first_index: int) -> str:
    """The text the model writes for these (name, arguments) calls."""
    if family == "kimi_k2":
        parts = [
            f"<|tool_call_begin|>functions.{name}:{first_index + i}<|tool_call_argument_begin|>"
            f"{json.dumps(args, ensure_ascii=False)}<|tool_call_end|>"
            for i, (name, args) in enumerate(calls)
        ]
        return KIMI_SECTION_BEGIN + "".join(parts) + KIMI_SECTION_END
    if family == "qwen3":
        blocks = []
        for name, args in calls:
            params = "".join(
                f"<parameter={key}>\n{_qwen_value(value)}\n</parameter>\n"
                for key, value in args.items()
            )
            blocks.append(f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
        return "\n".join(blocks)
    raise ValueError(f"no tool-call format for family {family!r}")


def _qwen_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
