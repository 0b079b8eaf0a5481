"""Talking to an emulated server in the emulator tests: the OpenAI client, raw HTTP."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
import openai

from compose.emulator.model import EmulatedModel

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
