"""A refused API key against the emulated server (SGLang's `--api-key`): the worker and its
real client pause in one line, dead-letter nothing, and resume once the server takes the key."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from streams.core.records import PromptRecord
from streams.core.settings import GenerateSettings, KafkaSettings
from streams.generate.client import AUTH, SLOW, HttpServerClient
from streams.generate.worker import GenerateWorker, generate_backoff
from tests.polling import wait_for_async

StartEmulator = Callable[..., AbstractAsyncContextManager[Any]]
SERVER_KEY = "sk-server-7c2e41"
WORKER_KEY = "sk-worker-93ab0d"


def settings(url: str, **overrides: Any) -> GenerateSettings:
    values: dict[str, Any] = {
        "server": url,
        "kafka": KafkaSettings(bootstrap="127.0.0.1:9"),  # never connected to
        "concurrency": 4,
        "max_attempts": 1,  # a refused key counted as an attempt would dead-letter at once
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.02,
        "health_interval_s": 0.05,
        "api_key": WORKER_KEY,
    }
    values.update(overrides)
    return GenerateSettings(**values)


def test_the_probe_tries_the_key_since_health_needs_none(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36", api_key=SERVER_KEY) as emu:
            client = HttpServerClient(settings(emu.base_url))
            assert await client.unavailable() == AUTH
            emu.engine.settings.api_key = WORKER_KEY
            assert await client.unavailable() is None
            emu.engine.ready_at = float("inf")  # loading: /health_generate answers 503
            assert await client.unavailable() == SLOW  # it answers: not down, not ready either
            await client.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("with_model", [False, True], ids=["discovered", "given"])
def test_a_refused_key_pauses_at_start_and_on_requests_until_the_server_takes_it(
    start_emulator: StartEmulator, caplog: pytest.LogCaptureFixture, with_model: bool
) -> None:
    sent: list[tuple[str, bytes]] = []

    async def send(topic: str, key: bytes, value: bytes) -> None:
        sent.append((topic, key))

    async def scenario() -> None:
        async with start_emulator("qwen36", api_key=SERVER_KEY) as emu:
            model = emu.engine.settings.model if with_model else None
            worker_settings = settings(emu.base_url, model=model)
            worker = GenerateWorker(
                worker_settings,
                HttpServerClient(settings(emu.base_url, model=model)),
                send,
                "completions",
                "dead-letters",
                backoff=generate_backoff(worker_settings),
            )
            worker.start_soon()
            await until(lambda: worker.stats.paused_for == AUTH, "paused for the key")
            emu.engine.settings.api_key = WORKER_KEY  # the operator fixed it
            await until(lambda: worker.intake.ready.is_set(), "started")
            assert not worker.stats.paused

            # the key changes under a running worker: its prompts wait, none is dead-lettered
            emu.engine.settings.api_key = SERVER_KEY
            events = [Event(offset, f"p{offset}") for offset in range(6)]
            # more prompts than slots: the consumer's next submit waits, as the agent's would
            submits = [asyncio.create_task(worker.submit(event)) for event in events]
            await until(lambda: worker.stats.paused_for == AUTH, "paused on requests")
            assert sent == [] and worker.stats.dead_letters == 0
            emu.engine.settings.api_key = WORKER_KEY
            await until(lambda: all(e.acked for e in events), "all acked")
            await asyncio.gather(*submits)
            assert [topic for topic, _ in sent] == ["completions"] * 6
            assert worker.stats.dead_letters == 0 and worker.stats.retries == 0
            await worker.stop()

    with caplog.at_level("INFO"):
        asyncio.run(scenario())
    refused = [r for r in caplog.records if "refuses the API key" in r.getMessage()]
    assert len(refused) == 2, caplog.text  # one per pause: at start, then on requests
    assert "unreachable" not in caplog.text and "dead letter" not in caplog.text
    assert SERVER_KEY not in caplog.text and WORKER_KEY not in caplog.text


async def until(condition: Callable[[], Any], what: str) -> Any:
    async def check() -> Any:
        return condition()

    return await wait_for_async(check, 10, what)


class Event:
    """A consumed prompt as the worker sees it (key, value, message.tp/offset, ack)."""

    def __init__(self, offset: int, prompt_id: str) -> None:
        messages = [{"role": "user", "content": f"question {prompt_id}"}]
        self.key = prompt_id.encode()
        self.value = PromptRecord(prompt_id=prompt_id, messages=messages, source="t").encode()
        self.message = _Message("prompts-0", offset)
        self.acked = False

    def ack(self) -> bool:
        self.acked = True
        return True


class _Message:
    def __init__(self, tp: str, offset: int) -> None:
        self.tp = tp
        self.offset = offset
