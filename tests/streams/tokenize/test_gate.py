"""The quality gate's measures (streams/tokenize/gate.py): the repetition share against a
brute-force count, the think-marker reading, tool arguments, examples and the window tally."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core.records import CompletionRecord
from streams.tokenize.gate import (
    EXAMPLE_CHARS,
    GateTally,
    bad_tool_arguments,
    excerpt,
    repeated_share,
    think_marker,
)


def brute_share(tokens: list[int], n: int) -> float:
    if len(tokens) < 2 * n:
        return 0.0
    seen: set[tuple[int, ...]] = set()
    repeats = 0
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i : i + n])
        repeats += gram in seen
        seen.add(gram)
    return repeats / (len(tokens) - n + 1)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 5), max_size=120),  # a small alphabet: many repeats
    st.integers(1, 12),
)
def test_repeated_share_is_the_share_of_ngrams_seen_before(tokens: list[int], n: int) -> None:
    assert repeated_share(tokens, n) == brute_share(tokens, n)


def test_a_loop_scores_by_how_much_of_the_output_it_covers() -> None:
    text = list(np.random.default_rng(0).integers(0, 150_000, 2000))
    assert repeated_share(text, 32) == 0.0
    looped = text[:1000] + list(np.resize(text[:100], 1000))
    assert 0.45 < repeated_share(looped, 32) < 0.5
    assert repeated_share(np.tile(text[:50], 40), 32) > 0.95
    assert repeated_share(text[:63], 32) == 0.0  # shorter than two n-grams: not judged


def test_think_marker_finds_what_is_left_of_the_reasoning_not_pairs_in_the_answer() -> None:
    def left(text: str) -> str | None:
        return think_marker(text, "<think>", "</think>")

    assert left("plain answer") is None
    assert left("Write <think> first and </think> last: <think>x</think>.") is None
    assert left("so the reasoning ends here</think>The answer is 4") == (
        "the answer holds a </think> with no <think> before it"
    )
    assert left("4. <think>wait, let me reconsider") == "the answer holds a <think> never closed"
    assert left("  <think>r</think>4") == "the answer starts with <think>"
    assert think_marker("</think>", "", "") is None  # a family without thinking


def test_tool_arguments_must_be_a_json_object() -> None:
    def call(arguments: Any) -> dict[str, Any]:
        return {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}

    assert bad_tool_arguments(None) is None
    assert bad_tool_arguments([call('{"a": 1}'), call({"a": 1})]) is None
    assert "tool call 1 (f): arguments are not JSON" in str(
        bad_tool_arguments([call("{}"), call('{"a": ')])
    )
    assert (
        bad_tool_arguments([call("[1, 2]")]) == "tool call 0 (f): arguments are list, not an object"
    )
    assert bad_tool_arguments([call(None)]) == "tool call 0 (f): arguments are NoneType"


def test_excerpts_are_one_line_and_bounded() -> None:
    text = "line one\n\n" + "word " * 200 + "\nTHE END"
    tail = excerpt(text)
    assert tail.startswith("…") and tail.endswith("THE END") and "\n" not in tail
    assert len(tail) <= EXAMPLE_CHARS + 2
    around = excerpt(text, text.index("word") + 500)
    assert around.startswith("…") and around.endswith("…")
    assert excerpt("short\ntext") == "short text"


def test_a_window_tally_counts_by_source_and_keeps_the_first_examples() -> None:
    tally = GateTally(per_key=2)

    def completion(pid: str, source: str) -> CompletionRecord:
        return CompletionRecord(prompt_id=pid, source=source, messages=[], content=f"a{pid}")

    for pid, source in [("1", "a.jsonl"), ("2", "b.jsonl"), ("3", "a.jsonl")]:
        tally.add("drop", "repetition", completion(pid, source))
    tally.add("flag", "think_markers", completion("4", "b.jsonl"))
    assert tally.counts == {
        "drop:repetition": {"a.jsonl": 2, "b.jsonl": 1},
        "flag:think_markers": {"b.jsonl": 1},
    }
    assert [e.split(":")[0] for e in tally.examples["drop:repetition"]] == ["1", "2"]
