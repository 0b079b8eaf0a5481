"""The emulator under load and failure: context limits, injected faults, the running cap."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import pytest

from tests.compose.emulator_client import (
    CONTEXT_MESSAGE,
    StartEmulator,
    chat,
    get,
    post,
    user,
)
from tests.polling import wait_for_async


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
