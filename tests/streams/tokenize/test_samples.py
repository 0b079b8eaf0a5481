"""SampleBuilder: masks exactly over the generated turn, server ids kept as given, drift, errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.core.families import detect_family
from streams.core.records import CompletionRecord
from streams.tokenize.samples import (
    SampleBuilder,
    SampleError,
)
from tests.ids import as_list
from tests.streams.tokenize.sample_cases import (
    SETTINGS,
    TOOLS,
    Family,
    completions,
    encode,
    expected_turn,
    split,
)


@SETTINGS
@given(data=st.data())
def test_mask_covers_exactly_the_generated_turn(fam: Family, data: st.DataObject) -> None:
    completion = data.draw(completions())
    turn = expected_turn(fam, completion)
    prompt = fam.template(completion.messages, completion.tools, add_generation_prompt=True)
    sample = fam.builder().build(completion)
    assert sample.token_source == "rendered" and sample.drift is None
    assert len(as_list(sample.loss_mask)) == len(as_list(sample.input_ids))
    prompt_ids, turn_ids = split(sample)
    # one contiguous run of ones at the end: nothing outside the turn is supervised
    assert as_list(sample.loss_mask) == [0] * len(prompt_ids) + [1] * len(turn_ids)
    # ids(prompt) + ids(turn), each encoded alone, as at inference
    assert prompt_ids == encode(fam, prompt)
    assert turn_ids == encode(fam, turn)
    assert fam.text(turn_ids) == fam.normal(turn)
    assert turn_ids[-1] == fam.tokenizer.convert_tokens_to_ids(fam.profile.end_of_turn)
    # the unsupervised part is exactly the rendered prompt, generation prompt included
    assert fam.text(prompt_ids) == fam.normal(prompt)


@pytest.mark.parametrize("reasoning", [None, "", "  \n"])
def test_qwen_empty_reasoning_is_the_prompt_then_the_turn(
    families: dict[str, Family], reasoning: str | None
) -> None:
    """The prefilled `<think>\\n` and the turn's `\\n</think>` would encode jointly as one
    `\\n\\n` token; the server encodes the prompt alone and the model writes `\\n</think>`."""
    qwen = families["qwen36"]
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "hi"}],
        reasoning_content=reasoning,
        content="Hello!",
    )
    prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    turn = "\n</think>\n\nHello!<|im_end|>"
    sample = qwen.builder().build(completion)
    assert as_list(sample.input_ids) == encode(qwen, prompt) + encode(qwen, turn)
    assert as_list(sample.input_ids) != encode(qwen, prompt + turn)  # the joint encoding merges
    prompt_ids, turn_ids = split(sample)
    assert prompt_ids == encode(qwen, prompt) and qwen.text(turn_ids) == turn
    think_close = qwen.tokenizer.convert_tokens_to_ids("</think>")
    assert think_close in turn_ids
    # the server's ids for it (the prompt encoded alone, then the model's tokens) show no drift
    served = replace(
        completion, prompt_token_ids=encode(qwen, prompt), output_token_ids=encode(qwen, turn)
    )
    checked = qwen.builder().build(served)
    assert (checked.token_source, checked.drift) == ("server", False)
    kimi = families["kimi_k26"]  # Kimi keeps the reasoning as written
    kimi_turn = kimi.text(split(kimi.builder().build(completion))[1])
    assert kimi_turn == f"{reasoning or ''}</think>Hello!<|im_end|>"


def test_real_qwen_vocabulary_empty_reasoning(
    qwen36_real_dir: Path, load_tokenizer: Callable[[Path], Any]
) -> None:
    """With Qwen3.6's own ids: the prompt ends `<think>` `\\n` and the turn starts `\\n`
    `</think>`, where the joint encoding would hold one `\\n\\n` token instead."""
    tokenizer = load_tokenizer(qwen36_real_dir)
    think_open, think_close = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    assert (think_open, think_close) == (248068, 248069)  # seen in the real tokenizer
    completion = CompletionRecord(
        prompt_id="p", messages=[{"role": "user", "content": "hi"}], content="Hello!"
    )
    builder = SampleBuilder(tokenizer, detect_family(qwen36_real_dir))
    rendered = builder.render(completion)
    prompt_ids, turn_ids = split(builder.build(completion))
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    double = tokenizer("\n\n", add_special_tokens=False)["input_ids"]
    assert len(newline) == len(double) == 1
    assert prompt_ids[-2:] == [think_open, *newline]
    assert turn_ids[:2] == [*newline, think_close]
    joint = tokenizer(rendered.prompt + rendered.turn, add_special_tokens=False)["input_ids"]
    assert joint[len(prompt_ids) - 1 : len(prompt_ids) + 1] == [*double, think_close]


@SETTINGS
@given(data=st.data())
def test_truncated_output_has_no_end_of_turn(fam: Family, data: st.DataObject) -> None:
    completion = data.draw(completions(finish="length"))
    result = fam.builder().build_many([completion])[0]
    if isinstance(result, SampleError):
        assert result.kind == "too_few_loss_tokens"  # nothing was written at all
        assert not (completion.reasoning_content or completion.content)
        return
    turn = fam.text(split(result)[1])
    end = fam.profile.end_of_turn
    assert not turn.endswith(end)
    if completion.content or completion.tool_calls:
        assert turn + end == fam.normal(expected_turn(fam, completion))
    else:  # stopped inside the reasoning: as the model wrote it, not even a think close
        assert turn == fam.normal(completion.reasoning_content or "")


def test_truncated_inside_reasoning_is_the_reasoning_only(fam: Family) -> None:
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "hi"}],
        reasoning_content="Let me think about th",
        content="",
        finish_reason="length",
    )
    _, turn_ids = split(fam.builder().build(completion))
    assert fam.text(turn_ids) == "Let me think about th"


@pytest.mark.parametrize(
    "content", ["<think>\nhidden\n</think>\n\nshown", "a</think>b</think>\nc", "  x  "]
)
def test_qwen_inline_think_in_content_follows_the_template(
    families: dict[str, Family], content: str
) -> None:
    qwen = families["qwen36"]
    completion = CompletionRecord(
        prompt_id="p", messages=[{"role": "user", "content": "hi"}], content=content
    )
    assert qwen.builder().render(completion).turn == expected_turn(qwen, completion)


def test_generated_tool_calls_render_in_the_family_format(fam: Family) -> None:
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "Weather in Paris and Rome?"}],
        tools=TOOLS,
        reasoning_content="Two calls.",
        content="",
        tool_calls=[
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
            }
            for i, city in enumerate(["Paris", "Rome"])
        ],
        finish_reason="tool_calls",
    )
    _, turn_ids = split(fam.builder().build(completion))
    if fam.name == "qwen36":
        assert fam.text(turn_ids) == (
            "Two calls.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
            "Paris\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>"
            "\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call><|im_end|>"
        )
    else:  # the ids as given: the K2.5/K2.6 template prints them so
        assert fam.text(turn_ids) == (
            "Two calls.</think><|tool_calls_section_begin|>"
            "<|tool_call_begin|>call_0<|tool_call_argument_begin|>"
            '{"city": "Paris"}'
            "<|tool_call_end|><|tool_call_begin|>call_1<|tool_call_argument_begin|>"
            '{"city": "Rome"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
        )


@pytest.mark.parametrize(
    ("given", "printed"),
    [
        ("call_abc", "call_abc"),
        ("functionsexec5", "functionsexec5"),
        ("functions.search:7", "functions.search:7"),
        (None, "functions.search:1"),  # none given: numbered over the conversation
        ("", "functions.search:1"),
    ],
)
def test_kimi_tool_call_ids_are_printed_as_given(
    families: dict[str, Family], given: str | None, printed: str
) -> None:
    kimi = families["kimi_k26"]
    earlier = {"id": "x", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    generated: dict[str, Any] = {
        "type": "function",
        "function": {"name": "search", "arguments": '{"q": "a"}'},
    }
    if given is not None:
        generated["id"] = given
    completion = CompletionRecord(
        prompt_id="p",
        messages=[
            {"role": "user", "content": "find a"},
            {"role": "assistant", "content": "", "tool_calls": [earlier]},
            {"role": "tool", "tool_call_id": "x", "content": "nothing"},
        ],
        tools=TOOLS,
        tool_calls=[generated],
        finish_reason="tool_calls",
    )
    turn = kimi.text(split(kimi.builder().build(completion))[1])
    assert f"<|tool_call_begin|>{printed}<|tool_call_argument_begin|>" in turn
    if given:  # the template renders the same turn
        assert turn == expected_turn(kimi, completion)


ARGUMENT_VALUES = {
    "flag": True,
    "off": False,
    "none": None,
    "n": 3,
    "x": 0.5,
    "s": "3",
    "o": {"a": 1},
}


@pytest.mark.parametrize(
    ("tool_args_json", "printed"),
    [
        (True, ["true", "false", "null", "3", "0.5", "3", '{"a": 1}']),  # Qwen3.6: tojson
        (False, ["True", "False", "None", "3", "0.5", "3", '{"a": 1}']),  # Qwen3.5: | string
    ],
)
def test_qwen_tool_arguments_print_as_the_template_prints_them(
    families: dict[str, Family], tool_args_json: bool, printed: list[str]
) -> None:
    qwen = families["qwen36"]
    assert qwen.profile.tool_args_json  # the shipped template is Qwen3.6's
    profile = replace(qwen.profile, tool_args_json=tool_args_json)
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "go"}],
        tools=TOOLS,
        reasoning_content="Call.",
        tool_calls=[
            {
                "id": "c",
                "type": "function",
                "function": {"name": "run_shell", "arguments": json.dumps(ARGUMENT_VALUES)},
            }
        ],
        finish_reason="tool_calls",
    )
    turn = SampleBuilder(qwen.tokenizer, profile).render(completion).turn
    for name, text in zip(ARGUMENT_VALUES, printed, strict=True):
        assert f"<parameter={name}>\n{text}\n</parameter>\n" in turn
    if tool_args_json:
        assert turn == expected_turn(qwen, completion)


# --- server ids and drift ------------------------------------------------------------------
