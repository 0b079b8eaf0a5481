"""The emulator's /health_generate under load, as SGLang's: a 1-token request queued like any
other, healthy once the server produced output since the probe began, 503 after its timeout."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.compose.emulator_client import EmulatorHandle, StartEmulator, get, post, user
from tests.polling import wait_for_async

# one running slot, and an answer that holds it ~2 s (41 tokens with the end of turn, at 20/s)
BUSY: dict[str, Any] = {
    "max_running_requests": 1,
    "tokens_per_s": 20.0,
    "min_output_tokens": 40,
    "max_output_tokens": 40,
}


async def load_is(emu: EmulatorHandle, running: int, queued: int) -> bool:
    stats = (await get(emu, "/stats"))[1]
    return bool((stats["running"], stats["queued"]) == (running, queued))


def test_a_busy_servers_probe_answers_once_a_slot_frees(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36", **BUSY) as emu:
            body = {"messages": user("hi")}
            running = asyncio.create_task(post(emu, "/v1/chat/completions", body))
            await wait_for_async(lambda: load_is(emu, 1, 0), 10, "the request running")
            status, _ = await get(emu, "/health_generate")
            _, stats = await get(emu, "/stats")
            # the probe waited for the slot: it answered once the request had finished
            assert (status, stats["completed"]) == (200, 1)
            assert (await running)[0] == 200

    asyncio.run(scenario())


def test_a_busy_servers_probe_answers_503_after_its_timeout(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36", health_check_timeout_s=0.05, **BUSY) as emu:
            body = {"messages": user("hi")}
            running = asyncio.create_task(post(emu, "/v1/chat/completions", body))
            await wait_for_async(lambda: load_is(emu, 1, 0), 10, "the request running")
            assert (await get(emu, "/health_generate"))[0] == 503
            # the probe left the queue; the request goes on
            await wait_for_async(lambda: load_is(emu, 1, 0), 10, "the probe gone from the queue")
            assert (await running)[0] == 200
            _, stats = await get(emu, "/stats")
            assert (stats["requests"], stats["completed"], stats["errors"]) == (1, 1, {})

    asyncio.run(scenario())
