"""The generate worker's client against the emulated server in each way of returning exact
token ids: the probe finds the way, the worker logs it, and the ids reach the completion record."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from compose.emulator import chat as emulator_chat
from compose.emulator import errors as emulator_errors
from streams.core.records import PromptRecord
from streams.core.settings import GenerateSettings, KafkaSettings
from streams.generate.client import HttpServerClient
from streams.generate.exact_ids import PROBE_REQUEST, find_ids, way_of
from streams.generate.worker import GenerateWorker, generate_backoff

StartEmulator = Callable[..., AbstractAsyncContextManager[Any]]

# emulator style: the way the probe finds, where it found the ids, and whether they are exact
WAYS = {
    "vllm": ("return_token_ids", ("prompt_token_ids", "choices[].token_ids"), True),
    "choices": ("return_token_ids", ("choices[].prompt_token_ids", "choices[].token_ids"), True),
    "response_token_ids": (
        "return_token_ids",
        ("choices[].prompt_token_ids", "choices[].response_token_ids"),
        True,
    ),
    "sglext": ("sglext", ("sglext.input_ids", "sglext.output_ids"), True),
    "prompt_token_ids": ("return_prompt_token_ids", ("choices[].prompt_token_ids",), False),
    "none": ("none", (), False),
}


async def _no_send(topic: str, key: bytes, value: bytes) -> None:
    raise AssertionError("nothing is sent in these tests")


@pytest.mark.parametrize("style", sorted(WAYS))
def test_ids_reach_the_completion_record(
    start_emulator: StartEmulator,
    style: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    name, fields, exact = WAYS[style]
    # what each request asked for, and the ids the emulator answered it with
    seen: list[tuple[dict[str, Any], list[int], list[int]]] = []
    attach = emulator_chat.attach_token_ids

    def spy(style: str, asked: dict[str, Any], response: Any, prompt: Any, output: Any) -> None:
        seen.append((dict(asked), prompt, output))
        attach(style, asked, response, prompt, output)

    monkeypatch.setattr(emulator_chat, "attach_token_ids", spy)

    async def scenario() -> None:
        async with start_emulator("qwen36", ids_style=style) as emu:
            settings = GenerateSettings(
                server=emu.base_url, kafka=KafkaSettings(bootstrap="127.0.0.1:9")
            )
            client = HttpServerClient(settings)
            worker = GenerateWorker(
                settings,
                client,
                _no_send,
                "completions",
                "dead-letters",
                backoff=generate_backoff(settings),
            )
            with caplog.at_level(logging.INFO, logger="streams.generate.worker"):
                await worker.start()
            messages = [{"role": "user", "content": "Explain write-ahead logs."}]
            record = await client.complete(PromptRecord(prompt_id="p1", messages=messages))
            await worker.stop()

        assert (client.ids_way.name, client.ids_way.fields) == (name, fields)
        # one probe asking every way, then requests asking the way found (or nothing)
        assert [asked for asked, _, _ in seen] == [PROBE_REQUEST, client.ids_way.asked]
        _, prompt_ids, output_ids = seen[-1]
        if exact:
            assert record.prompt_token_ids == prompt_ids
            assert record.output_token_ids == output_ids
            assert record.usage["completion_tokens"] == len(output_ids)
        else:
            assert record.prompt_token_ids is None and record.output_token_ids is None
        lines = [r for r in caplog.records if "token ids" in r.getMessage()]
        assert len(lines) == 1
        line = lines[0]
        if exact:
            assert line.levelno == logging.INFO
            assert f"returns exact token ids via {' + '.join(fields)}" in line.getMessage()
        else:
            assert line.levelno == logging.WARNING
            assert "samples will be rendered" in line.getMessage()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_no_probe_when_ids_are_off(start_emulator: StartEmulator) -> None:
    async def scenario() -> None:
        async with start_emulator("qwen36", ids_style="sglext") as emu:
            settings = GenerateSettings(
                server=emu.base_url,
                kafka=KafkaSettings(bootstrap="127.0.0.1:9"),
                return_token_ids=False,
            )
            client = HttpServerClient(settings)
            await client.discover()
            way = await client.probe_ids()
            messages = [{"role": "user", "content": "hi"}]
            record = await client.complete(PromptRecord(prompt_id="p1", messages=messages))
            await client.close()
            assert way.name == "none" and emu.engine.stats.requests == 1
            assert record.prompt_token_ids is None

    asyncio.run(scenario())


def test_sglext_is_preferred_and_read_per_choice() -> None:
    """A server with every way answers them all: sglext wins; its output ids are per choice."""
    body = {
        "choices": [{"prompt_token_ids": [1, 2], "token_ids": [7, 8], "message": {}}],
        "prompt_token_ids": [1, 2],
        "sglext": {"input_ids": [1, 2], "output_ids": [[7, 8], [9]]},
    }
    way = way_of(body)
    assert way.name == "sglext" and way.asked == {
        "return_input_ids_in_sglext": True,
        "return_output_ids_in_sglext": True,
    }
    found = find_ids(body)
    assert (found.prompt, found.output) == ([1, 2], [7, 8])
    assert way_of({"choices": [{"message": {}}]}).name == "none"


def test_refused_probe_asks_every_way(
    start_emulator: StartEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that answers the probe with a 400 is asked every way on each request."""

    async def scenario() -> None:
        async with start_emulator("qwen36", ids_style="sglext") as emu:
            check = emu.engine.check_context

            def refuse_the_probe(text: str, length: int, max_new: int | None) -> None:
                if max_new == 1:
                    raise emulator_errors.bad_request("not this one")
                check(text, length, max_new)

            emu.engine.check_context = refuse_the_probe
            settings = GenerateSettings(
                server=emu.base_url, kafka=KafkaSettings(bootstrap="127.0.0.1:9")
            )
            client = HttpServerClient(settings)
            await client.discover()
            with caplog.at_level(logging.WARNING, logger="streams.generate.client"):
                assert await client.probe_ids() is None
            messages = [{"role": "user", "content": "hi"}]
            record = await client.complete(PromptRecord(prompt_id="p1", messages=messages))
            await client.close()
        assert "asking every way" in caplog.text and "not this one" in caplog.text
        assert record.prompt_token_ids and record.output_token_ids

    asyncio.run(scenario())
