"""Prompts render as SGLang of the server's version renders them (issue 26).

Every case is rendered through the emulated server's chat endpoint (which prepares requests as
the SGLang version it reports) and through the worker's own rendering (`--api native`, the
tokenize stage), for each normalization profile: the ids must be the same. The bundled prompts
are checked the same way, and the tokenize stage names a normalization difference as its own
drift cause.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import httpx2
import pytest
from aiohttp.test_utils import TestServer

from compose.emulator import EmulatorSettings, build_app
from compose.emulator.model import EmulatedModel
from compose.tiny_tokenizers import build_kimi_k26_tokenizer, build_qwen36_tokenizer
from streams.core.normalize import make_prompt_record
from streams.core.records import CompletionRecord
from streams.core.serving import (
    NEWEST,
    NEWEST_VLLM,
    PROFILES,
    detect_content_format,
)
from streams.core.settings import GenerateSettings, KafkaSettings
from streams.core.tokenizers import LoadedTokenizer, load_tokenizer
from streams.generate.client import HttpServerClient
from streams.generate.native import NativeChat
from streams.tokenize.samples import Sample, SampleBuilder
from tests.streams.generate.normalization_cases import (
    CASES,
    HISTORY,
    SAMPLES,
    WEATHER,
    Case,
)


@dataclass
class Target:
    name: str
    directory: Path
    model: EmulatedModel
    loaded: LoadedTokenizer


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Target]:
    root = tmp_path_factory.mktemp("normalization")
    dirs = {
        "qwen36": build_qwen36_tokenizer(root / "qwen36"),
        "kimi_k26": build_kimi_k26_tokenizer(root / "kimi_k26"),
    }
    return {n: Target(n, d, EmulatedModel(d), load_tokenizer(d)) for n, d in dirs.items()}


def _bodies(target: Target, cases: list[Case]) -> list[dict[str, Any]]:
    kwargs = target.loaded.profile.template_kwargs(True)
    bodies = []
    for case in cases:
        body: dict[str, Any] = {
            "model": "m",
            "messages": case.messages,
            "max_tokens": 1,
            "chat_template_kwargs": kwargs,
            "return_token_ids": True,
        }
        if case.tools:
            body["tools"] = case.tools
            body["tool_choice"] = case.tool_choice
        bodies.append(body)
    return bodies


def served_prompt_ids(
    target: Target, version: str, cases: list[Case], kind: str = "sglang"
) -> list[list[int] | str]:
    """The prompt ids the emulated server's chat endpoint used for each case (or its error)."""
    settings = EmulatorSettings(
        tokenizer_dir=target.directory, kind=kind, sglang_version=version, vllm_version=version
    )

    async def run() -> list[list[int] | str]:
        server = TestServer(build_app(settings, target.model), host="127.0.0.1")
        await server.start_server()
        try:
            async with httpx2.AsyncClient(base_url=str(server.make_url(""))) as http:
                out: list[list[int] | str] = []
                for body in _bodies(target, cases):
                    response = await http.post("/v1/chat/completions", json=body)
                    answer = response.json()
                    if response.status_code != 200:
                        out.append(str(answer))
                        continue
                    out.append(answer["prompt_token_ids"])
                return out
        finally:
            await server.close()

    return asyncio.run(asyncio.wait_for(run(), 120))


def version_of(profile: str) -> str:
    """A release the profile describes (the oldest ones start at version 0)."""
    oldest = {"sglang-0.5.1": "0.5.1", "vllm-0.11": "0.11.0"}
    return oldest.get(profile) or ".".join(map(str, PROFILES[profile].since))


def worker_prompt_ids(target: Target, profile: str, case: Case) -> list[int] | str:
    native = NativeChat(target.loaded, thinking=True, normalization=PROFILES[profile])
    try:
        return native.render_messages(case.messages, case.tools, case.tool_choice).input_ids
    except ValueError as err:
        return str(err)


# -- the agreement --------------------------------------------------------------------------


@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("family", ["qwen36", "kimi_k26"])
def test_every_case_renders_to_the_chat_endpoints_ids(
    targets: dict[str, Target], family: str, profile: str
) -> None:
    target = targets[family]
    names = sorted(CASES)
    kind = PROFILES[profile].kind
    served = served_prompt_ids(target, version_of(profile), [CASES[n] for n in names], kind)
    for name, server_ids in zip(names, served, strict=True):
        if isinstance(server_ids, str):
            # the server refused it (e.g. 0.5.1 hands Qwen's template argument text, which it
            # cannot iterate): the worker's rendering must refuse it too
            assert isinstance(worker_prompt_ids(target, profile, CASES[name]), str), name
            continue
        assert worker_prompt_ids(target, profile, CASES[name]) == server_ids, name


def test_the_newest_profile_renders_every_case(targets: dict[str, Target]) -> None:
    """The default profile refuses none of the cases, for either family."""
    for target in targets.values():
        served = served_prompt_ids(target, "0.5.23", list(CASES.values()))
        assert all(isinstance(ids, list) for ids in served), served


def test_the_profiles_render_tools_differently(targets: dict[str, Target]) -> None:
    """The cases tell the profiles apart: else agreement would prove nothing per version."""
    target = targets["qwen36"]
    renders = {p: worker_prompt_ids(target, p, CASES["tools"]) for p in PROFILES}
    assert renders["sglang-0.5.23"] != renders["sglang-0.5.11"] != renders["sglang-0.5.9"]
    assert renders["sglang-0.5.9"] != renders["sglang-0.5.4"]
    # vLLM dumps its own tool models: neither SGLang's nor the request's
    assert renders["vllm-0.33"] not in (renders["sglang-0.5.23"], renders["sglang-0.5.11"])


def test_the_vllm_profiles_differ_where_their_releases_do(targets: dict[str, Target]) -> None:
    """History reasoning reaches the template from 0.12; list content is "openai" for the Qwen
    template from 0.22 (a string's text becomes a part); Kimi's goes back to "string" from
    0.30 (vLLM's detector follows macros); not-JSON arguments are a 400 until 0.29."""
    qwen, kimi = targets["qwen36"], targets["kimi_k26"]
    history = CASES["tool_results_typed_arguments"]
    assert worker_prompt_ids(qwen, "vllm-0.11", history) != worker_prompt_ids(
        qwen, "vllm-0.12", history
    )
    formats = {
        p: tuple(PROFILES[p].template_content_format(t.model.chat_template) for t in (qwen, kimi))
        for p in ("vllm-0.20", "vllm-0.22", "vllm-0.30")
    }
    assert formats == {
        "vllm-0.20": ("string", "string"),
        "vllm-0.22": ("openai", "openai"),
        "vllm-0.30": ("openai", "string"),
    }
    bad = Case([*HISTORY[:1], {**HISTORY[1], "tool_calls": [_not_json()]}], [WEATHER])
    assert isinstance(worker_prompt_ids(qwen, "vllm-0.22", bad), str)  # a 400
    assert isinstance(worker_prompt_ids(qwen, "vllm-0.29", bad), list)  # rendered with {}


def _not_json() -> dict[str, Any]:
    return {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{"}}


@pytest.mark.parametrize("family", ["qwen36", "kimi_k26"])
def test_bundled_prompts_render_as_the_server_and_the_tokenize_stage(
    targets: dict[str, Target], family: str
) -> None:
    """The 41 bundled prompts: the chat endpoint's prompt ids (SGLang 0.5.23), `--api native`'s
    and the tokenize stage's rendering are the same ids: no drift at the prompt side."""
    target = targets[family]
    rows = [json.loads(line) for line in SAMPLES.read_text().splitlines() if line.strip()]
    prompts = [make_prompt_record(row, "samples") for row in rows]
    cases = [Case(p.messages, p.tools) for p in prompts]
    served = served_prompt_ids(target, "0.5.23", cases)
    builder = SampleBuilder(target.loaded.tokenizer, target.loaded.profile)
    kwargs = target.loaded.profile.template_kwargs(True)
    native = NativeChat(target.loaded, thinking=True)
    differ = []
    for prompt, server_ids in zip(prompts, served, strict=True):
        assert isinstance(server_ids, list), server_ids
        record = CompletionRecord(
            prompt_id=prompt.prompt_id,
            messages=prompt.messages,
            tools=prompt.tools,
            content="x",
            sampling={"chat_template_kwargs": kwargs},
            normalization=NEWEST.name,
        )
        rendered = target.model.encode(builder.render_prompt(record))
        if not (rendered == server_ids == native.render(prompt).input_ids):
            differ.append(prompt.prompt_id)
    assert len(prompts) == 41
    assert differ == []


# -- the server's version picks the profile -------------------------------------------------


@pytest.mark.parametrize(
    ("version", "forced", "expected"),
    [
        ("0.5.23", None, "sglang-0.5.23"),
        ("0.5.12", None, "sglang-0.5.11"),
        ("0.5.8", None, "sglang-0.5.4"),
        ("0.5.3", None, "sglang-0.5.1"),
        ("0.5.12", "sglang-0.5.23", "sglang-0.5.23"),
        ("vllm 0.34.0", None, "vllm-0.33"),
        ("vllm 0.28.0", None, "vllm-0.22"),
        ("vllm 0.9.2", None, "vllm-0.11"),
        ("vllm 0.34.0", "vllm-0.12", "vllm-0.12"),
    ],
)
def test_the_worker_takes_the_profile_of_the_reported_version(
    targets: dict[str, Target], version: str, forced: str | None, expected: str
) -> None:
    """SGLang says its version in /server_info, vLLM in /version ("vllm X" below)."""
    target = targets["qwen36"]
    kind, _, version = version.rpartition(" ")
    settings = EmulatorSettings(
        tokenizer_dir=target.directory,
        kind=kind or "sglang",
        sglang_version=version,
        vllm_version=version,
    )

    async def run() -> tuple[str, str | None, str]:
        server = TestServer(build_app(settings, target.model), host="127.0.0.1")
        await server.start_server()
        client = HttpServerClient(
            GenerateSettings(
                server=str(server.make_url("")).rstrip("/"),
                kafka=KafkaSettings(bootstrap="127.0.0.1:9"),
                normalization=forced,
            )
        )
        try:
            await client.discover()
            chosen = await client.use_server_version()
            record = await client.complete(
                make_prompt_record({"messages": [{"role": "user", "content": "Hi"}]}, "t")
            )
            return chosen.name, client.server_version, record.normalization
        finally:
            await client.close()
            await server.close()

    name, reported, recorded = asyncio.run(asyncio.wait_for(run(), 60))
    assert (name, reported, recorded) == (expected, version, expected)


def test_content_format_detection(targets: dict[str, Target]) -> None:
    assert detect_content_format("{{ messages[0]['content'] }}") == "string"
    assert detect_content_format("{% for c in message['content'] %}{{ c }}{% endfor %}") == (
        "openai"
    )
    assert detect_content_format("{% for c in m.content | list %}{{ c }}{% endfor %}") == "openai"
    for target in targets.values():  # both mention images: SGLang's shortcut says openai
        assert target.model.content_format == "openai"


def test_a_normalization_difference_is_its_own_drift_cause(targets: dict[str, Target]) -> None:
    """A server that preprocessed as 0.5.11 while the record says 0.5.23: the prompt drifts,
    and the cause names the profile that renders the server's ids, not a token pair."""
    target = targets["qwen36"]
    kwargs = target.loaded.profile.template_kwargs(True)
    record = CompletionRecord(
        prompt_id="p",
        messages=CASES["tools"].messages,
        tools=CASES["tools"].tools,
        content="It is sunny.",
        reasoning_content="Easy.\n",
        finish_reason="stop",
        sampling={"chat_template_kwargs": kwargs},
        normalization=NEWEST.name,
    )
    builder = SampleBuilder(target.loaded.tokenizer, target.loaded.profile)
    old_prompt = builder.render_prompt(record, PROFILES["sglang-0.5.11"])
    turn = builder.render(record).turn
    served = replace_ids(record, target.model.encode(old_prompt), target.model.encode(turn))
    sample = builder.build(served)
    assert sample.drift is True
    assert sample.normalization == "sglang-0.5.23"
    assert sample.drift_cause is not None
    assert sample.drift_cause.key == "prompt normalization: the server rendered as sglang-0.5.11"
    # rendered as the server did, it does not drift
    agreeing = builder.build(
        replace_ids(
            served, target.model.encode(builder.render_prompt(record)), target.model.encode(turn)
        )
    )
    assert (agreeing.drift, agreeing.drift_cause) == (False, None)


def replace_ids(record: CompletionRecord, prompt: list[int], output: list[int]) -> CompletionRecord:
    return dataclasses.replace(record, prompt_token_ids=prompt, output_token_ids=output)


@pytest.mark.parametrize(
    ("api", "kind"), [("chat", "sglang"), ("native", "sglang"), ("chat", "vllm")]
)
@pytest.mark.parametrize("family", ["qwen36", "kimi_k26"])
def test_bundled_prompts_do_not_drift(
    targets: dict[str, Target], family: str, api: str, kind: str
) -> None:
    """`draftgen run`'s path without Kafka: the 41 bundled prompts generated by the client
    against the emulator (SGLang 0.5.23 or vLLM 0.34.0; some answers are tool calls), then
    built by the tokenize stage with the drift check: no sample drifts."""
    target = targets[family]
    rows = [json.loads(line) for line in SAMPLES.read_text().splitlines() if line.strip()]
    prompts = [make_prompt_record(row, "samples") for row in rows]
    settings = EmulatorSettings(tokenizer_dir=target.directory, tool_call_rate=0.5, kind=kind)

    async def run() -> list[CompletionRecord]:
        server = TestServer(build_app(settings, target.model), host="127.0.0.1")
        await server.start_server()
        reuse = mock.patch("streams.generate.client.load_tokenizer", return_value=target.loaded)
        with reuse:
            client = HttpServerClient(
                GenerateSettings(
                    server=str(server.make_url("")).rstrip("/"),
                    kafka=KafkaSettings(bootstrap="127.0.0.1:9"),
                    api=api,
                    tokenizer_dir=str(target.directory) if api == "native" else None,
                )
            )
        try:
            await client.discover()
            await client.use_server_version()
            await client.probe_ids()
            return [await client.complete(p) for p in prompts]
        finally:
            await client.close()
            await server.close()

    records = asyncio.run(asyncio.wait_for(run(), 300))
    records = [CompletionRecord.decode(r.encode()) for r in records]
    assert {r.normalization for r in records} == {
        (NEWEST if kind == "sglang" else NEWEST_VLLM).name
    }
    if api == "chat":  # the server's ids, not a rendering
        assert all(
            r.prompt_token_ids is not None and r.output_token_ids is not None for r in records
        )
    if api == "chat":  # /generate gets ids only: its emulated model writes no tool calls
        assert any(r.tool_calls for r in records)  # the turn side is exercised too
    builder = SampleBuilder(target.loaded.tokenizer, target.loaded.profile)
    samples = builder.build_many(records)
    drifted = [
        (r.prompt_id, str(getattr(s, "drift_cause", s)))
        for r, s in zip(records, samples, strict=True)
        if not (isinstance(s, Sample) and s.drift is False)
    ]
    assert len(records) == 41
    assert drifted == []
