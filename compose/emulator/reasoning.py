"""SGLang's reasoning split (BaseReasoningFormatDetector.detect_and_parse), non-streaming."""

from __future__ import annotations


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
