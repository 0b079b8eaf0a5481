"""`--api native` against the emulated server: the prompt rendered by the worker and posted to
/generate gives the record the chat endpoint would give, with the exact ids, in each family."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from streams.core.records import CompletionRecord, PromptRecord
from streams.core.settings import GenerateSettings, KafkaSettings
from streams.core.tokenizers import load_tokenizer
from streams.generate.client import HttpServerClient
from streams.generate.native import NativeChat
from streams.generate.worker import GenerateWorker, generate_backoff
from tests.weather import WEATHER_HISTORY, WEATHER_TOOLS

StartEmulator = Callable[..., AbstractAsyncContextManager[Any]]
FAMILIES = ["kimi_k26", "qwen36"]


def generate_settings(url: str, **overrides: Any) -> GenerateSettings:
    return GenerateSettings(server=url, kafka=KafkaSettings(bootstrap="127.0.0.1:9"), **overrides)


async def _no_send(topic: str, key: bytes, value: bytes) -> None:
    raise AssertionError("nothing is sent in these tests")


async def complete(settings: GenerateSettings, prompt: PromptRecord) -> CompletionRecord:
    client = HttpServerClient(settings)
    worker = GenerateWorker(
        settings,
        client,
        _no_send,
        "completions",
        "dead-letters",
        backoff=generate_backoff(settings),
    )
    await worker.start()
    try:
        return await client.complete(prompt)
    finally:
        await worker.stop()


GENERATED = (
    "reasoning_content",
    "content",
    "tool_calls",
    "finish_reason",
    "prompt_token_ids",
    "output_token_ids",
)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("thinking", [True, False])
def test_native_record_matches_the_chat_endpoints(
    start_emulator: StartEmulator,
    tiny_tokenizer_dirs: dict[str, Path],
    family: str,
    thinking: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Explain write-ahead logs."},
    ]
    prompt = PromptRecord(prompt_id="p1", messages=messages)

    async def scenario() -> None:
        async with start_emulator(family) as emu:
            chat = await complete(generate_settings(emu.base_url, thinking=thinking), prompt)
            native_settings = generate_settings(
                emu.base_url,
                thinking=thinking,
                api="native",
                tokenizer_dir=str(tiny_tokenizer_dirs[family]),
            )
            with caplog.at_level(logging.INFO, logger="streams.generate.worker"):
                native = await complete(native_settings, prompt)
            assert emu.engine.stats.requests == 3  # the chat probe, the chat, the native one

        assert chat.output_token_ids, "the emulator's chat endpoint returns ids"
        for name in GENERATED:
            assert getattr(native, name) == getattr(chat, name), name
        assert native.usage["completion_tokens"] == len(native.output_token_ids or [])
        assert (native.reasoning_content is not None) == thinking
        assert "returns exact token ids via input_ids + output_ids" in caplog.text

    asyncio.run(asyncio.wait_for(scenario(), 60))


@pytest.mark.parametrize("family", FAMILIES)
def test_native_splits_tool_calls_as_the_chat_endpoint(
    start_emulator: StartEmulator, tiny_tokenizer_dirs: dict[str, Path], family: str
) -> None:
    """/generate knows no tools, so the emulator writes no call there: the chat endpoint's raw
    output ids, read as /generate would return them, must parse to the chat endpoint's answer."""
    history = copy.deepcopy(WEATHER_HISTORY)
    prompt = PromptRecord(prompt_id="p1", messages=history, tools=WEATHER_TOOLS)

    async def scenario() -> tuple[CompletionRecord, Any]:
        async with start_emulator(family, tool_call_rate=1.0) as emu:
            chat = await complete(generate_settings(emu.base_url), prompt)
            return chat, emu.model

    chat, model = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert chat.finish_reason == "tool_calls" and chat.tool_calls
    native = NativeChat(load_tokenizer(tiny_tokenizer_dirs[family]), thinking=True)
    rendered = native.render(prompt)
    assert rendered.input_ids == chat.prompt_token_ids  # the server's rendering, to the token
    ids = chat.output_token_ids or []
    answer = {
        "text": model.decode(ids[:-1], skip_special_tokens=False),  # stop token trimmed
        "output_ids": ids,
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": ids[-1]},
            "prompt_tokens": len(rendered.input_ids),
            "completion_tokens": len(ids),
        },
    }
    fields = native.completion_fields(rendered, answer)
    for name in ("reasoning_content", "content", "finish_reason", "output_token_ids"):
        assert fields[name] == getattr(chat, name), name
    calls = fields["tool_calls"]
    assert [c["function"] for c in calls] == [c["function"] for c in chat.tool_calls]
    if family == "kimi_k26":  # SGLang's kimi_k2 ids count the history's calls
        assert [c["id"] for c in calls] == [c["id"] for c in chat.tool_calls]


def test_native_needs_a_tokenizer() -> None:
    with pytest.raises(ValueError, match="--api native needs --tokenizer-dir"):
        generate_settings("http://x", api="native")
