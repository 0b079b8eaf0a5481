"""The quality gate's measures: what the sample policy (policies.py) checks beyond lengths.

- ``repetition``: the share of the output's n-grams (of ``--repetition-ngram`` tokens, 32) that
  already occurred earlier in the same output (seq-rep-n, Welleck et al. 2019, "Neural text
  generation with unlikelihood training"). A model in a loop repeats whole blocks: a loop over
  the last half of an output scores about 0.5, a paragraph written forty times about 0.97.
  Real prose and code score far lower at 32 tokens; the defaults are measured on real text in
  BENCHMARKS.md, "The quality gate". Computed on the supervised tokens (thinking included),
  from outputs of at least ``--repetition-min-tokens``.
- ``think_markers``: the answer (``content``) still holds what is left of the reasoning: a
  think close with no open before it (a reasoning parser that missed the split), an open never
  closed (a second thought), or an answer that starts with an open.
- ``tool_args``: a tool call whose ``function.arguments`` is not a JSON object.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson

from sinks.shards import Tokens

# the base of the rolling hash (odd, so invertible modulo 2**64) and its inverse
_BASE = 0x9E3779B97F4A7C15
_BASE_INVERSE = pow(_BASE, -1, 2**64)
# an example is this many characters of the output, around where the rule fired
EXAMPLE_CHARS = 240


def repeated_share(tokens: Tokens, n: int) -> float:
    """The share of the n-grams of `tokens` that occurred earlier in them (0 when there are
    fewer than 2n tokens: too short to tell a loop). Each n-gram's hash is a polynomial rolling
    hash modulo 2**64, from prefix sums: linear in the tokens, whatever n is."""
    ids = np.asarray(tokens, dtype=np.uint64)
    if n < 1 or ids.size < 2 * n:
        return 0.0
    count = ids.size - n + 1
    with np.errstate(over="ignore"):  # every step wraps modulo 2**64, as meant
        powers = np.cumprod(np.full(ids.size, _BASE, dtype=np.uint64)) * np.uint64(_BASE_INVERSE)
        prefix = np.concatenate([np.zeros(1, np.uint64), np.cumsum(ids * powers, dtype=np.uint64)])
        # sum of x[i+k] * B^(i+k) over the window, brought back to B^k by B^-i
        unshift = np.cumprod(np.full(count, _BASE_INVERSE, dtype=np.uint64)) * np.uint64(_BASE)
        hashes = np.sort((prefix[n:] - prefix[:count]) * unshift)
    # np.unique is eight times slower here (numpy 2.4)
    distinct = 1 + int(np.count_nonzero(hashes[1:] != hashes[:-1]))
    return (count - distinct) / count


def think_marker(content: str | None, think_open: str, think_close: str) -> str | None:
    """What is left of the reasoning in the answer, or None: a close with no open before it (the
    reasoning parser missed the split), an open never closed (a second thought), or an answer
    that starts with an open. Pairs inside the answer (an answer about think tags) are text."""
    text = content or ""
    if not think_open or not think_close:
        return None
    if text.lstrip().startswith(think_open):
        return f"the answer starts with {think_open}"
    pattern = re.compile("|".join(re.escape(m) for m in (think_open, think_close)))
    depth = 0
    for found in pattern.finditer(text):
        if found.group() == think_open:
            depth += 1
        elif depth == 0:
            return f"the answer holds a {think_close} with no {think_open} before it"
        else:
            depth -= 1
    return f"the answer holds a {think_open} never closed" if depth else None


def bad_tool_arguments(tool_calls: list[dict[str, Any]] | None) -> str | None:
    """Why a tool call's arguments are not a JSON object (the first such call), or None."""
    for index, call in enumerate(tool_calls or []):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, dict):
            continue  # already parsed by the server
        if not isinstance(arguments, str):
            return f"tool call {index} ({name}): arguments are {type(arguments).__name__}"
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError as err:
            return f"tool call {index} ({name}): arguments are not JSON ({err})"
        if not isinstance(parsed, dict):
            kind = type(parsed).__name__
            return f"tool call {index} ({name}): arguments are {kind}, not an object"
    return None


def excerpt(text: str, at: int | None = None) -> str:
    """About EXAMPLE_CHARS characters of `text` on one line, from a third of them before `at`
    (default: its end)."""
    start = max(0, len(text) - EXAMPLE_CHARS if at is None else at - EXAMPLE_CHARS // 3)
    piece = " ".join(text[start : start + EXAMPLE_CHARS].split())
    return ("…" if start else "") + piece + ("…" if start + EXAMPLE_CHARS < len(text) else "")


def example(rule: str, completion: Any) -> str:
    """What a user reads to judge a verdict of `rule` on a completion (CompletionRecord): the
    answer around a think marker, the broken arguments, else the end of the output (where a
    loop or a cut shows)."""
    content = completion.content or ""
    if rule == "think_markers":
        marker = next((m for m in ("</think>", "<think>") if m in content), None)
        return excerpt(content, content.find(marker) if marker else None)
    if rule == "tool_args":
        for call in completion.tool_calls or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                return excerpt(str(function.get("arguments")), 0)
    return excerpt(f"{completion.reasoning_content or ''}\n{content}")


class GateTally:
    """A window's verdicts for its marker: "drop:RULE"/"flag:RULE" → source → count, and the
    first `per_key` examples of each."""

    def __init__(self, per_key: int = 2):
        self.per_key = per_key
        self.counts: dict[str, dict[str, int]] = {}
        self.examples: dict[str, list[str]] = {}

    def add(self, verdict: str, rule: str, completion: Any) -> None:
        key = f"{verdict}:{rule}"
        by_source = self.counts.setdefault(key, {})
        by_source[completion.source] = by_source.get(completion.source, 0) + 1
        shown = self.examples.setdefault(key, [])
        if len(shown) < self.per_key:
            shown.append(f"{completion.prompt_id}: {example(rule, completion)}")
