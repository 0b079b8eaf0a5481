"""The emulator's API surface: id styles, native /generate, info and health, auth, flags."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from compose.emulator import EmulatorSettings, add_emulator_arguments, settings_from_args
from compose.process import free_port
from tests.compose.emulator_client import (
    StartEmulator,
    chat,
    client_for,
    get,
    post,
    user,
)

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
            # a sampling parameter out of SGLang's range (SamplingParams.verify)
            hot = {"messages": user("hi"), "temperature": -0.5}
            status, body = await post(emu, "/v1/chat/completions", hot)
            assert status == 400 and "temperature = -0.5" in body["message"]
            wide = {"text": "hi", "sampling_params": {"top_p": 1.5, "max_new_tokens": 4}}
            status, body = await post(emu, "/generate", wide)
            assert status == 400 and "top_p = 1.5" in str(body["error"])
            fine = {"messages": user("hi"), "temperature": 0.6, "top_k": 20, "max_tokens": 8}
            status, body = await post(emu, "/v1/chat/completions", fine)
            assert status == 200, body

    asyncio.run(scenario())


# -- command line and process -----------------------------------------------------------------


def test_cli_flags_fill_settings(tmp_path: Path) -> None:
    (tmp_path / "my-model").mkdir()
    (tmp_path / "script.jsonl").touch()
    parser = argparse.ArgumentParser()
    add_emulator_arguments(parser)
    args = parser.parse_args(
        [
            "--tokenizer-dir", str(tmp_path / "my-model"),
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
            "--request-log", str(tmp_path / "requests.jsonl"),
        ]
    )  # fmt: skip
    settings = settings_from_args(args)
    assert settings.model == "my-model"  # the directory's name
    assert settings.script == tmp_path / "script.jsonl"
    assert settings.request_log == tmp_path / "requests.jsonl"
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
    argv = [sys.executable, "-m", "compose.emulator", "--tokenizer-dir", str(qwen36_tokenizer_dir)]
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
