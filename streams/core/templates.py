"""A conversation as SGLang's chat endpoint hands it to the chat template: the tools as function
dicts, tool-call arguments as objects, text-only content. The tokenize stage renders with the
same tools; the generate stage renders whole prompts for `--api native`."""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any


def template_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The tools as SGLang hands them to the chat template: each OpenAI tool's function as
    its pydantic dump (`item.function.model_dump()`), not the `{"type", "function"}` wrapper.
    Templates print them as JSON, so any other shape renders another prompt than the
    server's (and shows as drift on every prompt with tools)."""
    if not tools:
        return None
    out = []
    for tool in tools:
        function = tool.get("function", tool)
        out.append(
            {
                "description": function.get("description"),
                "name": function.get("name"),
                "parameters": function.get("parameters"),
                "strict": bool(function.get("strict", False)),
            }
        )
    return out


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """One message as SGLang's jinja path prepares it: text parts joined, None content as "",
    tool-call arguments decoded from JSON (left as text when they are not JSON)."""
    out = copy.deepcopy(message)
    content = out.get("content")
    if isinstance(content, list):
        texts = [part.get("text", "") for part in content if isinstance(part, dict)]
        out["content"] = "\n".join(str(text) for text in texts if text)
    elif content is None:
        out["content"] = ""
    for call in out.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            with contextlib.suppress(ValueError):  # not JSON: the template gets the text
                function["arguments"] = json.loads(function["arguments"])
    return out
