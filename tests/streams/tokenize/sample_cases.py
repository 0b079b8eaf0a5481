"""SampleBuilder test cases: the two tiny target families, conversation strategies and the
template oracle (shared by test_samples*.py; the fixtures are in conftest.py)."""

from __future__ import annotations

import copy
import json
import unicodedata
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from streams.core.families import FamilyProfile
from streams.core.records import CompletionRecord
from streams.core.serving import NEWEST
from streams.tokenize.samples import (
    Sample,
    SampleBuilder,
)
from tests.ids import as_list

FAMILIES = ("qwen36", "kimi_k26")
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@dataclass(frozen=True)
class Family:
    name: str
    directory: Path
    tokenizer: Any
    profile: FamilyProfile

    def builder(self, **kwargs: Any) -> SampleBuilder:
        return SampleBuilder(self.tokenizer, self.profile, **kwargs)

    def template(
        self,
        messages: list[dict[str, Any]],
        tools: Any,
        generated: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> str:
        # as SGLang hands them to the template: arguments parsed, None fields left out; a
        # generated turn as the model wrote it (Qwen's template iterates its arguments)
        messages = NEWEST.messages(messages, "openai")
        if generated is not None:
            messages = [
                *messages,
                *(decoded([generated]) if self.name == "qwen36" else [generated]),
            ]
        text = self.tokenizer.apply_chat_template(
            messages,
            tools=NEWEST.tools(tools),  # as SGLang passes them
            tokenize=False,
            **self.profile.template_kwargs(True),
            **kwargs,
        )
        assert isinstance(text, str)
        return text

    def text(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids))

    def normal(self, text: str) -> str:
        """What decoding gives back: Qwen's tokenizer applies NFC."""
        return unicodedata.normalize("NFC", text) if self.name == "qwen36" else text


# --- conversations -------------------------------------------------------------------------

WORDS = st.sampled_from(
    ["the", "model", "answer", "think", " ", "\n", "  ", "Paris", "x = 1", "日本", "é", "🎉"]
)
TEXT = st.one_of(
    st.lists(WORDS, max_size=8).map("".join),
    st.text(st.characters(codec="utf-8"), max_size=24),
)
TOOL_NAMES = st.sampled_from(["get_weather", "run_shell", "search"])
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} tool",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    for name in ("get_weather", "run_shell", "search")
]
ARGUMENTS = st.dictionaries(
    st.sampled_from(["q", "city", "n", "flags"]),
    st.one_of(TEXT, st.integers(-5, 5), st.booleans(), st.lists(st.integers(0, 3), max_size=3)),
    max_size=3,
)


@st.composite
def tool_calls(draw: st.DrawFn, counter: list[int]) -> list[dict[str, Any]]:
    calls = []
    for _ in range(draw(st.integers(1, 2))):
        name = draw(TOOL_NAMES)
        counter[0] += 1
        style = draw(st.sampled_from(["openai", "kimi"]))
        call_id = f"call_{counter[0]}" if style == "openai" else f"functions.{name}:{counter[0]}"
        arguments = json.dumps(draw(ARGUMENTS), ensure_ascii=draw(st.booleans()))
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )
    return calls


@st.composite
def completions(draw: st.DrawFn, finish: str | None = None) -> CompletionRecord:
    """A prompt (system or not, multi-turn, tools) ending on a user or tool turn, plus the
    generated turn (reasoning or not, content, tool calls or not)."""
    counter = [0]
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(TEXT)})
    for turn in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(TEXT) or f"question {turn}"})
        for _ in range(draw(st.integers(0, 2))):  # tool rounds
            calls = draw(tool_calls(counter))
            messages.append(_assistant(draw, calls))
            for call in calls:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": draw(TEXT)})
        if draw(st.booleans()):
            messages.append(_assistant(draw, None))
        else:
            break
    if messages[-1]["role"] == "assistant":
        messages.append({"role": "user", "content": draw(TEXT) or "more"})
    has_calls = any(m.get("tool_calls") for m in messages)
    generated_calls = draw(tool_calls(counter)) if draw(st.booleans()) else None
    return CompletionRecord(
        prompt_id="p",
        messages=messages,
        tools=TOOLS if has_calls or generated_calls or draw(st.booleans()) else None,
        reasoning_content=draw(st.one_of(st.none(), TEXT, TEXT.map("I think {}".format))),
        # a trimmed record, whose Qwen turn the template's rendering is the oracle for; content
        # starting with a newline is SGLang's verbatim split (test_agreement.py)
        content=draw(TEXT).lstrip("\n"),
        tool_calls=generated_calls,
        finish_reason=finish or ("tool_calls" if generated_calls else "stop"),
    )


def _assistant(draw: st.DrawFn, calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": draw(TEXT)}
    if draw(st.booleans()):
        message["reasoning_content"] = draw(TEXT)
    if calls:
        message["tool_calls"] = calls
    return message


def decoded(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    messages = copy.deepcopy(messages)
    for message in messages:
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return messages


def expected_turn(fam: Family, completion: CompletionRecord) -> str:
    """The oracle, from the template itself: the finished conversation rendered with history
    thinking preserved, past the prompt rendered the same way with the generation prompt."""
    messages, tools = completion.messages, completion.tools
    full = fam.template(
        messages,
        tools,
        completion.generated_message(),
        add_generation_prompt=False,
        preserve_thinking=True,
    )
    prompt = fam.template(messages, tools, add_generation_prompt=True, preserve_thinking=True)
    assert full.startswith(prompt)
    turn = full[len(prompt) :]
    if fam.name == "qwen36":  # the template's newline after <|im_end|> is not the model's
        assert turn.endswith("<|im_end|>\n")
        turn = turn[:-1]
    return turn


def split(sample: Sample) -> tuple[list[int], list[int]]:
    start, ids = as_list(sample.loss_mask).index(1), as_list(sample.input_ids)
    return ids[:start], ids[start:]


# --- rendered samples ----------------------------------------------------------------------


def encode(fam: Family, text: str) -> list[int]:
    return list(fam.tokenizer(text, add_special_tokens=False)["input_ids"])


def with_server_ids(fam: Family, completion: CompletionRecord) -> CompletionRecord:
    """The ids a server gives: the prompt encoded alone, then the model's own tokens."""
    rendered = fam.builder().build(completion)
    prompt_ids, turn_ids = split(rendered)
    return replace(completion, prompt_token_ids=prompt_ids, output_token_ids=turn_ids)


def one_token(fam: Family, text: str) -> int:
    ids = encode(fam, text)
    assert len(ids) == 1, ids
    return ids[0]


def drifted(fam: Family) -> tuple[CompletionRecord, list[int], list[int]]:
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        reasoning_content="The capital is Paris.",
        content="Paris.",
        finish_reason="stop",
    )
    completion = with_server_ids(fam, completion)
    assert as_list(completion.prompt_token_ids) and as_list(completion.output_token_ids)
    return completion, list(completion.prompt_token_ids), list(completion.output_token_ids)
