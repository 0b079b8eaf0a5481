"""The SGLang-compatible emulator: API shapes, reasoning split, token ids, load and failures."""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from compose.emulator import EmulatorSettings, add_emulator_arguments, settings_from_args
from streams.core.parsers import split_reasoning
from tests.compose.emulator_client import (
    THINKING_KWARG,
    StartEmulator,
    chat,
    client_for,
    eot_text,
    get,
    user,
)
from tests.weather import WEATHER_HISTORY, WEATHER_TOOLS

# -- reasoning split and token ids ----------------------------------------------------------


def test_reasoning_split_and_token_ids(start_emulator: StartEmulator, family: str) -> None:
    async def scenario() -> None:
        async with start_emulator(family) as emu:
            model = emu.model
            messages = user("Explain write-ahead logs.")
            kwargs = {THINKING_KWARG[family]: True}
            response = await chat(emu, messages, chat_template_kwargs=kwargs)
            choice = response.choices[0]
            ids = choice.token_ids
            reasoning = choice.message.reasoning_content
            content = choice.message.content
            assert choice.finish_reason == "stop"
            assert choice.matched_stop == model.special.eot == ids[-1]
            assert reasoning and isinstance(content, str) and content
            # the template prefilled <think>: the output has no opening tag
            assert model.family.prefills_think
            expected = reasoning + model.family.think_close + content + eot_text(model)
            assert model.decode(ids, skip_special_tokens=False) == expected
            # prompt ids are the rendered template, encoded (what SGLang does)
            prompt = model.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **kwargs
            )
            assert response.prompt_token_ids == model.encode(prompt)
            usage = response.usage
            assert usage.prompt_tokens == len(response.prompt_token_ids)
            assert usage.completion_tokens == len(ids)  # the stop token counts
            assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
            assert 0 < usage.reasoning_tokens < len(ids)

    asyncio.run(scenario())


def test_same_prompt_same_output(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36", min_output_tokens=20, max_output_tokens=200) as emu:
            first = await chat(emu, user("Same prompt."))
            again = await chat(emu, user("Same prompt."))
            other = await chat(emu, user("Another prompt."))
        assert first.choices[0].token_ids == again.choices[0].token_ids
        assert first.choices[0].message.content == again.choices[0].message.content
        assert first.choices[0].token_ids != other.choices[0].token_ids
        # a server with another seed answers differently (like another sampling run)
        async with start_emulator("qwen36", seed=7) as emu:
            reseeded = await chat(emu, user("Same prompt."))
        assert reseeded.choices[0].token_ids != first.choices[0].token_ids

    asyncio.run(scenario())


def test_output_length_range(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36", min_output_tokens=40, max_output_tokens=60) as emu:
            lengths = [
                len((await chat(emu, user(f"prompt {i}"))).choices[0].token_ids) for i in range(8)
            ]
        # the text is fitted to a token budget to within a few words
        assert all(30 <= n <= 70 for n in lengths), lengths

    asyncio.run(scenario())


def test_long_tail_lengths(start_emulator: StartEmulator) -> None:
    """--long-fraction: a share of prompts, fixed by the prompt, gets a long answer from
    --long-output-tokens; the others keep the usual range."""

    async def scenario() -> list[int]:
        async with start_emulator(
            "qwen36",
            min_output_tokens=20,
            max_output_tokens=40,
            long_fraction=0.3,
            long_output_tokens=(400, 500),
        ) as emu:
            return [
                len((await chat(emu, user(f"prompt {i}"))).choices[0].token_ids) for i in range(30)
            ]

    lengths = asyncio.run(scenario())
    long = [n for n in lengths if n >= 350]
    short = [n for n in lengths if n <= 60]
    assert len(long) + len(short) == len(lengths), lengths  # nothing in between: two modes
    assert 3 <= len(long) <= 16, lengths  # ~30% of 30


def test_long_tail_flags(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_emulator_arguments(parser)
    given = ["--tokenizer-dir", str(tmp_path), "--long-fraction", "0.15"]
    settings = settings_from_args(parser.parse_args([*given, "--long-output-tokens", "3000-6000"]))
    assert (settings.long_fraction, settings.long_output_tokens) == (0.15, (3000, 6000))
    assert EmulatorSettings(tokenizer_dir=tmp_path).long_fraction == 0.0  # off by default
    for wrong in ("6000-3000", "3000", "a-b", "0-10"):
        with pytest.raises(SystemExit):
            parser.parse_args([*given, "--long-output-tokens", wrong])


def test_thinking_off(start_emulator: StartEmulator, family: str) -> None:
    async def scenario() -> None:
        async with start_emulator(family) as emu:
            kwargs = {THINKING_KWARG[family]: False}
            response = await chat(emu, user("No thinking."), chat_template_kwargs=kwargs)
            effort = await chat(emu, user("No thinking."), reasoning_effort="none")
        choice = response.choices[0]
        text = emu.model.decode(choice.token_ids, skip_special_tokens=False)
        assert choice.message.reasoning_content is None
        assert emu.model.family.think_close not in text
        assert text == choice.message.content + eot_text(emu.model)
        assert response.usage.reasoning_tokens == 0
        assert effort.choices[0].token_ids == choice.token_ids

    asyncio.run(scenario())


def test_separate_reasoning_false_keeps_text_whole(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("kimi_k26") as emu:
            response = await chat(emu, user("hi"), separate_reasoning=False)
        message = response.choices[0].message
        assert message.reasoning_content is None
        assert "</think>" in message.content

    asyncio.run(scenario())


def test_unclosed_thinking_is_all_reasoning(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36", unclosed_think_rate=1.0) as emu:
            response = await chat(emu, user("ramble"))
        choice = response.choices[0]
        assert choice.finish_reason == "stop"
        assert choice.message.content == ""
        assert choice.message.reasoning_content

    asyncio.run(scenario())


def test_split_reasoning_rules() -> None:
    split = split_reasoning
    assert split("a\n</think>\n\nb", "<think>", "</think>", True) == ("a\n", "\n\nb")
    assert split("<think>a</think>b</think>c", "<think>", "</think>", False) == ("a", "b</think>c")
    assert split("cut off", "<think>", "</think>", True) == ("cut off", "")
    assert split("plain", "<think>", "</think>", False) == ("", "plain")
    assert split("a<tool_call>x", "<think>", "</think>", True, "<tool_call>") == (
        "a",
        "<tool_call>x",
    )


# -- limits -----------------------------------------------------------------------------------


def test_max_tokens_cuts_with_length(start_emulator: StartEmulator, family: str) -> None:
    async def scenario() -> None:
        async with start_emulator(family, min_output_tokens=50, max_output_tokens=80) as emu:
            response = await chat(emu, user("long answer"), max_tokens=7)
            full = await chat(emu, user("long answer"))
        choice = response.choices[0]
        assert choice.finish_reason == "length"
        assert choice.matched_stop is None
        assert len(choice.token_ids) == 7 == response.usage.completion_tokens
        assert choice.token_ids == full.choices[0].token_ids[:7]  # the same output, cut
        # no </think> yet: everything is reasoning
        assert choice.message.content == ""
        assert choice.message.reasoning_content

    asyncio.run(scenario())


def test_script_gives_chosen_prompts_their_output(
    start_emulator: StartEmulator, family: str, tmp_path: Path
) -> None:
    """`--script`: the first entry whose match is in the prompt gives the text the model
    writes; it is sampled as its canonical ids plus the end-of-turn, and cut by max_tokens."""
    script = tmp_path / "script.jsonl"
    # the family's format: Qwen writes newlines around </think>
    answer = (
        "Paris is asked.\n</think>\n\nParis."
        if family == "qwen36"
        else "Paris is asked.</think>Paris."
    )
    entries = [
        {"match": "capital of France", "output": answer},
        {"match": "France", "output": "never used: the first match wins"},
    ]
    script.write_text("".join(json.dumps(e) + "\n" for e in entries))

    async def scenario() -> None:
        async with start_emulator(family, script=script) as emu:
            response = await chat(emu, user("The capital of France?"))
            cut = await chat(emu, user("The capital of France?"), max_tokens=2)
            other = await chat(emu, user("Something else"))
            model = emu.model
        choice = response.choices[0]
        written = choice.token_ids[:-1]
        assert model.decode(written, skip_special_tokens=False) == answer
        assert written == model.encode(answer)
        assert choice.token_ids[-1] == model.special.eot and choice.finish_reason == "stop"
        # split at </think>, whitespace kept, as SGLang's reasoning parser does
        assert choice.message.content == answer.split("</think>")[1]
        assert cut.choices[0].token_ids == choice.token_ids[:2]
        assert cut.choices[0].finish_reason == "length"
        assert "Paris" not in (other.choices[0].message.content or "")

    asyncio.run(scenario())


def test_script_entries_need_match_and_output(tmp_path: Path) -> None:
    from compose.emulator.generation import load_script

    script = tmp_path / "script.jsonl"
    script.write_text('{"match": "a", "output": "b"}\n\n{"match": "c"}\n')
    with pytest.raises(ValueError, match=r"script\.jsonl:3"):
        load_script(script)


# -- drift ------------------------------------------------------------------------------------


def test_drift_changes_ids_not_text(start_emulator: StartEmulator, family: str) -> None:
    async def scenario() -> None:
        prompts = [user(f"Question number {i}?") for i in range(4)]
        async with start_emulator(family) as emu:
            canonical = [await chat(emu, p) for p in prompts]
        async with start_emulator(family, drift_rate=1.0) as emu:
            drifted = [await chat(emu, p) for p in prompts]
            _, stats = await get(emu, "/stats")
        model = emu.model
        assert stats["drift"] == len(prompts)
        for normal, drift in zip(canonical, drifted, strict=True):
            n_ids, d_ids = normal.choices[0].token_ids, drift.choices[0].token_ids
            n_text = model.decode(n_ids[:-1], skip_special_tokens=False)
            d_text = model.decode(d_ids[:-1], skip_special_tokens=False)
            assert d_text == n_text  # same text ...
            assert model.encode(n_text) == n_ids[:-1]  # normal output re-encodes to itself
            assert model.encode(d_text) != d_ids[:-1]  # ... drifted output does not
            assert len(d_ids) > len(n_ids)
            assert drift.choices[0].message.content == normal.choices[0].message.content

    asyncio.run(scenario())


# -- tools ------------------------------------------------------------------------------------


def test_tool_calls(start_emulator: StartEmulator, family: str) -> None:
    async def scenario() -> None:
        history = copy.deepcopy(WEATHER_HISTORY)
        async with start_emulator(family, tool_call_rate=1.0) as emu:
            async with client_for(emu) as client:
                response: Any = await client.chat.completions.create(
                    model=emu.engine.settings.model,
                    messages=history,
                    tools=WEATHER_TOOLS,
                    extra_body={"return_token_ids": True},
                )
            plain = await chat(emu, user("no tools here"))
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls
        assert calls and calls[0].function.name == "get_weather"
        assert isinstance(json.loads(calls[0].function.arguments)["city"], str)
        if family == "kimi_k26":
            assert calls[0].id == "functions.get_weather:1"  # counts the history's calls
        text = emu.model.decode(choice.token_ids, skip_special_tokens=False)
        assert "get_weather" in text and text.endswith(eot_text(emu.model))
        assert plain.choices[0].finish_reason == "stop"
        assert plain.choices[0].message.tool_calls is None

    asyncio.run(scenario())
