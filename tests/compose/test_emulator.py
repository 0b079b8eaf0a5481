"""The SGLang-compatible emulator: API shapes, reasoning split, token ids, load and failures."""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from compose.emulator import EmulatorSettings, add_emulator_arguments, settings_from_args
from compose.emulator.model import EmulatedModel
from compose.process import free_port
from streams.core.parsers import split_reasoning
from tests.polling import wait_for_async
from tests.weather import WEATHER_HISTORY, WEATHER_TOOLS

# the fixtures' types (tests/compose/conftest.py: EmulatorHandle and its start_emulator factory)
EmulatorHandle = Any
StartEmulator = Callable[..., AbstractAsyncContextManager[Any]]

CONTEXT_MESSAGE = "The input ({n} tokens) is longer than the model's context length ({m} tokens)."
THINKING_KWARG = {"qwen36": "enable_thinking", "kimi_k26": "thinking"}


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def client_for(emu: EmulatorHandle) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{emu.base_url}/v1", api_key="none", max_retries=0)


async def chat(emu: EmulatorHandle, messages: Any, **extra: Any) -> Any:
    """A chat completion through the real OpenAI client, SGLang fields in extra_body."""
    body = {"return_token_ids": True, **extra}
    async with client_for(emu) as client:
        return await client.chat.completions.create(
            model=emu.engine.settings.model, messages=messages, extra_body=body
        )


async def post(emu: EmulatorHandle, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    url = emu.base_url + path
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as r:
        return r.status, await r.json(content_type=None)


async def get(emu: EmulatorHandle, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(emu.base_url + path) as r:
        text = await r.text()
        return r.status, json.loads(text) if text else None


def eot_text(model: EmulatedModel) -> str:
    return model.family.end_of_turn


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


def test_context_too_long_is_sglangs_400(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36", max_model_len=64) as emu:
            messages = user("word " * 200)
            status, body = await post(emu, "/v1/chat/completions", {"messages": messages})
            n = len(emu.model.encode(emu.model.render(messages)))
            assert status == 400
            assert body == {
                "object": "error",
                "message": CONTEXT_MESSAGE.format(n=n, m=64),
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
            with pytest.raises(openai.BadRequestError) as caught:
                await chat(emu, messages)
            assert "longer than the model's context length" in str(caught.value)
            # prompt + max_tokens over the context is refused too
            status, body = await post(
                emu, "/v1/chat/completions", {"messages": user("hi"), "max_tokens": 60}
            )
            assert status == 400
            assert body["message"].startswith("Requested token count exceeds")
            # native endpoint: {"error": {"message": ...}}
            status, body = await post(emu, "/generate", {"text": "word " * 200})
            assert status == 400
            assert "longer than the model's context length" in body["error"]["message"]
            _, stats = await get(emu, "/stats")
            assert stats["errors"]["context_length"] == 4

    asyncio.run(scenario())


def test_injected_context_failure_is_per_prompt(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36", rate_400_context=0.5) as emu:
            outcomes = {}
            for i in range(12):
                body = {"messages": user(f"prompt {i}")}
                first = (await post(emu, "/v1/chat/completions", body))[0]
                second = (await post(emu, "/v1/chat/completions", body))[0]
                assert first == second  # the same prompt always fails (or never)
                outcomes[i] = first
            assert set(outcomes.values()) == {200, 400}

    asyncio.run(scenario())


# -- injected failures ------------------------------------------------------------------------


def test_injected_503_and_500(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36", rate_503=1.0) as emu:
            status, body = await post(emu, "/v1/chat/completions", {"messages": user("hi")})
            assert status == 503
            assert body["message"] == "The request queue is full."
            assert body["object"] == "error" and body["code"] == 503
            with pytest.raises(openai.InternalServerError):
                await chat(emu, user("hi"))
        async with start_emulator("kimi_k26", rate_500=1.0) as emu:
            status, body = await post(emu, "/v1/chat/completions", {"messages": user("hi")})
            assert status == 500
            assert body["type"] == "InternalServerError"
            status, _ = await post(emu, "/generate", {"text": "hi"})
            assert status == 500
            _, stats = await get(emu, "/stats")
            assert stats["errors"] == {"injected_500": 2}

    asyncio.run(scenario())


def test_injected_faults_are_partial(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36", rate_503=0.3, rate_500=0.2) as emu:
            statuses = [
                (await post(emu, "/v1/chat/completions", {"messages": user("same")}))[0]
                for _ in range(40)
            ]
        # per attempt, not per prompt: retrying the same prompt can succeed
        assert {200, 500, 503} <= set(statuses)

    asyncio.run(scenario())


def test_timeout_resets_connection(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36", rate_timeout=1.0, timeout_hang_s=0.2) as emu:
            started = time.monotonic()
            with pytest.raises(aiohttp.ClientError):
                await post(emu, "/v1/chat/completions", {"messages": user("hi")})
            assert time.monotonic() - started >= 0.2
            with pytest.raises(openai.APIConnectionError):
                await chat(emu, user("hi"))

    asyncio.run(scenario())


def test_drop_cuts_the_body(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36", rate_drop=1.0) as emu:
            with pytest.raises(aiohttp.ClientPayloadError):
                await post(emu, "/v1/chat/completions", {"messages": user("hi")})
            with pytest.raises(aiohttp.ClientPayloadError):
                await post(emu, "/generate", {"text": "hi"})
            with pytest.raises(openai.APIConnectionError):
                await chat(emu, user("hi"))

    asyncio.run(scenario())


# -- load -------------------------------------------------------------------------------------


def test_running_cap_queues_and_decodes_concurrently(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        settings = {
            "max_running_requests": 2,
            "tokens_per_s": 100.0,
            "min_output_tokens": 20,
            "max_output_tokens": 40,
        }
        async with start_emulator("qwen36", **settings) as emu:
            started = time.monotonic()
            results = await asyncio.gather(*(chat(emu, user(f"p{i}")) for i in range(4)))
            elapsed = time.monotonic() - started
            _, stats = await get(emu, "/stats")
        decode_s = [len(r.choices[0].token_ids) / 100.0 for r in results]
        # two decoded at once, never more (the peak), and the other two waited their turn: the
        # four took at least half their serial decode time. Only a lower bound on time: load
        # on the machine can slow a run, never speed it up.
        assert stats["peak_running"] == 2
        assert stats["completed"] == 4 and stats["errors"] == {}
        assert elapsed >= sum(decode_s) / 2 * 0.9

    asyncio.run(scenario())


def test_queue_full_answers_503(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        settings = {
            "max_running_requests": 1,
            "max_queued_requests": 1,
            "tokens_per_s": 100.0,
            "min_output_tokens": 30,
            "max_output_tokens": 40,
        }
        async with start_emulator("qwen36", **settings) as emu:
            body = {"messages": user("hi")}

            async def load_is(running: int, queued: int) -> bool:
                stats = (await get(emu, "/stats"))[1]
                return (stats["running"], stats["queued"]) == (running, queued)

            running = asyncio.create_task(post(emu, "/v1/chat/completions", body))
            await wait_for_async(lambda: load_is(1, 0), 10, "the first request running")
            queued = asyncio.create_task(post(emu, "/v1/chat/completions", body))
            await wait_for_async(lambda: load_is(1, 1), 10, "the second request queued")
            status, error = await post(emu, "/v1/chat/completions", body)
            assert status == 503 and error["message"] == "The request queue is full."
            assert (await running)[0] == 200 and (await queued)[0] == 200
            _, stats = await get(emu, "/stats")
            assert stats["errors"] == {"queue_full": 1}

    asyncio.run(scenario())


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


# every request field that asks for ids, and where each style answers them: P the prompt's
# ids, O the output's (compose/emulator/token_ids.py)
ASK_EVERY_WAY = {
    "return_token_ids": True,
    "return_prompt_token_ids": True,
    "return_input_ids_in_sglext": True,
    "return_output_ids_in_sglext": True,
}
STYLE_FIELDS = {
    "vllm": {"prompt_token_ids": "P", "choices[].token_ids": "O"},
    "choices": {"choices[].prompt_token_ids": "P", "choices[].token_ids": "O"},
    "response_token_ids": {
        "choices[].prompt_token_ids": "P",
        "choices[].response_token_ids": "O",
    },
    "sglext": {"sglext.input_ids": "P", "sglext.output_ids": "[O]"},
    "prompt_token_ids": {"choices[].prompt_token_ids": "P"},
    "none": {},
}


def id_fields(body: dict[str, Any], prompt: list[int], output: list[int]) -> dict[str, str]:
    """Where a raw response carries ids, each named P, O or [O] by what it holds."""
    names = {json.dumps(prompt): "P", json.dumps(output): "O", json.dumps([output]): "[O]"}
    choice = body["choices"][0]
    places = {
        "prompt_token_ids": body.get("prompt_token_ids"),
        "choices[].prompt_token_ids": choice.get("prompt_token_ids"),
        "choices[].token_ids": choice.get("token_ids"),
        "choices[].response_token_ids": choice.get("response_token_ids"),
        **{f"sglext.{k}": v for k, v in (body.get("sglext") or {}).items()},
    }
    return {k: names.get(json.dumps(v), "?") for k, v in places.items() if v is not None}


@pytest.mark.parametrize("style", sorted(STYLE_FIELDS))
def test_ids_styles(start_emulator: StartEmulator, style: str) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36", ids_style=style) as emu:
            model = emu.model
            messages = user("Explain write-ahead logs.")
            prompt = model.encode(model.render(messages))
            # the same prompt gives the same output on every endpoint
            native = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4096}}
            _, generated = await post(emu, "/generate", native)
            output = generated["output_ids"]
            request = {"model": emu.engine.settings.model, "messages": messages}
            status, body = await post(emu, "/v1/chat/completions", {**request, **ASK_EVERY_WAY})
            assert status == 200
            assert body["usage"]["prompt_tokens"] == len(prompt)
            assert body["usage"]["completion_tokens"] == len(output)
            assert id_fields(body, prompt, output) == STYLE_FIELDS[style]
            # nothing asked, nothing answered; sglext answers each side it is asked for
            _, plain = await post(emu, "/v1/chat/completions", request)
            assert id_fields(plain, prompt, output) == {}
            one_side = {**request, "return_output_ids_in_sglext": True}
            _, output_only = await post(emu, "/v1/chat/completions", one_side)
            want = {"sglext.output_ids": "[O]"} if style == "sglext" else {}
            assert id_fields(output_only, prompt, output) == want

    asyncio.run(scenario())


# -- native /generate -------------------------------------------------------------------------


def test_generate_native(start_emulator: StartEmulator, family: str) -> None:
    async def scenario() -> None:
        async with start_emulator(family) as emu:
            model = emu.model
            prompt = model.render(user("native please"))
            input_ids = model.encode(prompt)
            request = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": 4096}}
            status, body = await post(emu, "/generate", request)
            assert status == 200
            ids = body["output_ids"]
            meta = body["meta_info"]
            assert meta["finish_reason"] == {"type": "stop", "matched": model.special.eot}
            assert ids[-1] == model.special.eot  # the stop token is in output_ids ...
            assert body["text"] == model.decode(ids[:-1])  # ... and trimmed from the text
            assert meta["prompt_tokens"] == len(input_ids)
            assert meta["completion_tokens"] == len(ids)
            assert meta["e2e_latency"] >= 0
            # the same prompt through the chat endpoint gives the same ids
            response = await chat(emu, user("native please"))
            assert response.choices[0].token_ids == ids
            # /generate's default max_new_tokens is 128; text input works too
            status, body = await post(emu, "/generate", {"text": prompt})
            assert status == 200 and len(body["output_ids"]) <= 128
            status, body = await post(
                emu, "/generate", {"text": prompt, "sampling_params": {"max_new_tokens": 3}}
            )
            assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
            assert len(body["output_ids"]) == 3

    asyncio.run(scenario())


# -- health and info --------------------------------------------------------------------------


def test_server_info_tells_the_running_cap(start_emulator: StartEmulator) -> None:
    """As SGLang: the flag at the top level (null when not given) and the scheduler's cap in
    each rank's internal state, under both names of the endpoint."""

    async def scenario() -> None:
        async with start_emulator("qwen36", max_running_requests=12) as emu:
            for path in ("/server_info", "/get_server_info"):
                status, info = await get(emu, path)
                assert status == 200
                assert info["max_running_requests"] == 12
                assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 12
        async with start_emulator("qwen36") as emu:  # no cap: it says none
            for path in ("/server_info", "/get_server_info"):
                _, info = await get(emu, path)
                assert info["max_running_requests"] is None
                assert "effective_max_running_requests_per_dp" not in info["internal_states"][0]

    asyncio.run(scenario())


def test_health_and_info_endpoints(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("kimi_k26", max_model_len=8192, model="kimi-k2.6") as emu:
            assert (await get(emu, "/health"))[0] == 200
            assert (await get(emu, "/health_generate"))[0] == 200
            status, models = await get(emu, "/v1/models")
            assert status == 200
            assert models["data"][0]["id"] == "kimi-k2.6"
            assert models["data"][0]["max_model_len"] == 8192
            async with client_for(emu) as client:
                listed = await client.models.list()
            assert [m.id for m in listed.data] == ["kimi-k2.6"]
            for path in ("/model_info", "/get_model_info"):
                status, info = await get(emu, path)
                assert status == 200 and info["is_generation"] is True
            for path in ("/server_info", "/get_server_info"):
                status, info = await get(emu, path)
                assert status == 200
                assert info["context_length"] == 8192
                assert info["reasoning_parser"] == "kimi_k2"
            status, tokens = await post(emu, "/v1/tokenize", {"messages": user("hi")})
            assert status == 200
            assert tokens["tokens"] == emu.model.encode(emu.model.render(user("hi")))

    asyncio.run(scenario())


def test_health_generate_waits_for_startup(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36", startup_delay_s=0.3) as emu:
            assert (await get(emu, "/health"))[0] == 200
            assert (await get(emu, "/health_generate"))[0] == 503
            # generation waits for the model instead of failing
            response = await chat(emu, user("early"))
            assert response.choices[0].finish_reason == "stop"
            assert (await get(emu, "/health_generate"))[0] == 200

    asyncio.run(scenario())


@pytest.mark.parametrize("status", [401, 403])
def test_an_api_key_is_required_everywhere_but_health(
    start_emulator: StartEmulator, status: int
) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36", api_key="sk-right", auth_status=status) as emu:
            assert (await get(emu, "/health"))[0] == 200  # SGLang exempts /health*
            assert (await get(emu, "/health_generate"))[0] == 200
            assert await get(emu, "/v1/models") == (status, {"error": "Unauthorized"})
            assert (await post(emu, "/generate", {"text": "hi"}))[0] == status
            wrong = openai.AsyncOpenAI(
                base_url=f"{emu.base_url}/v1", api_key="sk-wrong", max_retries=0
            )
            refused = openai.AuthenticationError if status == 401 else openai.PermissionDeniedError
            with pytest.raises(refused):
                await wrong.models.list()
            emu.engine.settings.api_key = "sk-wrong"  # a running server's key, changed
            assert [m.id for m in (await wrong.models.list()).data] == [emu.engine.settings.model]
            response = await wrong.chat.completions.create(
                model=emu.engine.settings.model, messages=user("hi")
            )
            assert response.choices[0].finish_reason == "stop"
            await wrong.close()

    asyncio.run(scenario())


def test_bad_requests(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36") as emu:
            status, body = await post(emu, "/v1/chat/completions", {"messages": []})
            assert status == 400 and body["object"] == "error"
            bad_role = {"messages": [{"role": "wizard", "content": "x"}]}
            status, body = await post(emu, "/v1/chat/completions", bad_role)
            assert status == 400
            status, body = await post(emu, "/generate", {"sampling_params": {}})
            assert status == 400 and "error" in body

    asyncio.run(scenario())


# -- command line and process -----------------------------------------------------------------


def test_cli_flags_fill_settings(tmp_path: Path) -> None:
    (tmp_path / "my-model").mkdir()
    (tmp_path / "script.jsonl").touch()
    parser = argparse.ArgumentParser()
    add_emulator_arguments(parser)
    args = parser.parse_args(
        [
            "--tokenizer", str(tmp_path / "my-model"),
            "--port", "31000",
            "--max-model-len", "4096",
            "--ids-style", "sglext",
            "--min-output-tokens", "5",
            "--max-output-tokens", "50",
            "--tokens-per-s", "1500",
            "--max-running-requests", "8",
            "--max-queued-requests", "16",
            "--fail-400-rate", "0.01",
            "--fail-503-rate", "0.02",
            "--fail-500-rate", "0.03",
            "--timeout-rate", "0.04",
            "--drop-rate", "0.05",
            "--drift-rate", "0.06",
            "--seed", "3",
            "--script", str(tmp_path / "script.jsonl"),
            "--api-key", "sk-emulated",
            "--auth-status", "403",
        ]
    )  # fmt: skip
    settings = settings_from_args(args)
    assert settings.model == "my-model"  # the directory's name
    assert settings.script == tmp_path / "script.jsonl"
    assert settings.host == "127.0.0.1"
    assert (settings.port, settings.max_model_len) == (31000, 4096)
    assert settings.ids_style == "sglext"
    assert EmulatorSettings(tokenizer_dir=tmp_path).ids_style == "vllm"  # as before the flag
    assert (settings.min_output_tokens, settings.max_output_tokens) == (5, 50)
    assert (settings.max_running_requests, settings.max_queued_requests) == (8, 16)
    assert settings.tokens_per_s == 1500
    rates = (
        settings.rate_400_context,
        settings.rate_503,
        settings.rate_500,
        settings.rate_timeout,
        settings.rate_drop,
        settings.drift_rate,
    )
    assert rates == (0.01, 0.02, 0.03, 0.04, 0.05, 0.06)
    assert settings.seed == 3
    assert (settings.api_key, settings.auth_status) == ("sk-emulated", 403)
    assert EmulatorSettings(tokenizer_dir=tmp_path).api_key is None  # open, as SGLang's default
    with pytest.raises(ValueError):
        EmulatorSettings(tokenizer_dir=tmp_path, rate_503=2.0)
    with pytest.raises(ValueError):
        EmulatorSettings(tokenizer_dir=tmp_path, ids_style="json")


def test_process_prints_ready_line_and_stops_on_sigterm(qwen36_tokenizer_dir: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "compose.emulator", "--tokenizer", str(qwen36_tokenizer_dir)]
    process = subprocess.Popen(
        [*argv, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.strip() == f"emulator listening on http://127.0.0.1:{port}"

        async def health() -> int:
            url = f"http://127.0.0.1:{port}/health_generate"
            async with aiohttp.ClientSession() as session, session.get(url) as r:
                return r.status

        assert asyncio.run(health()) == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
