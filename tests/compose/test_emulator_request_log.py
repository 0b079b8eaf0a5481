"""The emulator's request log: a line per generation request, naming its prompt by the digest
the prompt's holder computes from the messages it sent, and saying how the request ended."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import orjson

from compose.emulator.request_log import prompt_digest
from tests.compose.emulator_client import StartEmulator, client_for, get, user
from tests.weather import WEATHER_HISTORY, WEATHER_TOOLS


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


async def _ask(emu: Any, messages: list[dict[str, Any]], **extra: Any) -> str:
    """What the generate worker sends: the prompt's messages through the OpenAI client."""
    async with client_for(emu) as client:
        try:
            await client.chat.completions.create(
                model=emu.engine.settings.model, messages=messages, **extra
            )
        except openai.APIStatusError as err:
            return f"http_{err.status_code}"
        except openai.APIConnectionError:
            return "connection"
    return "ok"


def test_each_request_names_its_prompt_and_how_it_ended(
    start_emulator: StartEmulator, tmp_path: Path
) -> None:
    log = tmp_path / "requests.jsonl"
    question = user("What is a write-ahead log?")

    async def scenario() -> list[str]:
        seen = []
        async with start_emulator("qwen36", request_log=log) as emu:
            seen.append(await _ask(emu, question))
            # a conversation with a tool call and its result: the digest survives the client
            seen.append(await _ask(emu, WEATHER_HISTORY, tools=WEATHER_TOOLS))
            await get(emu, "/v1/models")  # not a generation: not logged
        async with start_emulator("qwen36", request_log=log, rate_503=1.0) as emu:
            seen.append(await _ask(emu, question))
        async with start_emulator("qwen36", request_log=log, rate_drop=1.0) as emu:
            seen.append(await _ask(emu, question))
        return seen

    answers = asyncio.run(scenario())
    assert answers == ["ok", "ok", "http_503", "connection"]
    lines = _lines(log)
    assert [(x["prompt"], x["outcome"]) for x in lines] == [
        (prompt_digest(question), "ok"),
        (prompt_digest(WEATHER_HISTORY), "ok"),
        (prompt_digest(question), "http_503"),
        (prompt_digest(question), "cut"),
    ]
    assert all(x["path"] == "/v1/chat/completions" and x["end"] >= x["start"] for x in lines)
