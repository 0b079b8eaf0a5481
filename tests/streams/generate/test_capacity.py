"""`--concurrency auto`: the worker keeps as many requests in flight as the server runs at once,
read from SGLang's /server_info (or /get_server_info on older servers); without an answer it
keeps the default and says so once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from compose.emulator import EmulatorSettings, build_app
from compose.emulator.model import EmulatedModel
from streams.cli.flags import build
from streams.cli.main import build_parser
from streams.core.settings import DEFAULT_CONCURRENCY, GenerateSettings, KafkaSettings
from streams.generate.capacity import running_cap
from streams.generate.client import HttpServerClient
from streams.generate.worker import GenerateWorker, generate_backoff


@pytest.mark.parametrize(
    ("info", "cap"),
    [
        # recent SGLang: the scheduler's cap per data-parallel rank, summed
        (
            {
                "max_running_requests": None,
                "internal_states": [{"effective_max_running_requests_per_dp": 48}],
            },
            48,
        ),
        ({"internal_states": [{"effective_max_running_requests_per_dp": 16}] * 2}, 32),
        # the flag given, a server whose ranks do not report a cap
        ({"max_running_requests": 64, "internal_states": [{"last_gen_throughput": 1.0}]}, 64),
        # a rank state that names it after the flag
        ({"internal_states": [{"max_running_requests": 24}]}, 24),
        # the scheduler's figure wins over the flag
        (
            {
                "max_running_requests": 64,
                "internal_states": [{"effective_max_running_requests_per_dp": 40}],
            },
            40,
        ),
        # nothing said
        ({"max_running_requests": None, "internal_states": []}, None),
        ({"max_running_requests": 0}, None),
        ({"max_running_requests": "many"}, None),
        ([], None),
    ],
)
def test_running_cap_from_server_info(info: Any, cap: int | None) -> None:
    assert running_cap(info) == cap


Middleware = Callable[[web.Request, Callable[[web.Request], Awaitable[web.StreamResponse]]], Any]


@web.middleware
async def older_server(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """A server from before /server_info: only /get_server_info answers."""
    if request.path == "/server_info":
        return web.Response(status=404)
    return await handler(request)


@contextlib.asynccontextmanager
async def emulator(
    tokenizer_dir: Path,
    model: EmulatedModel,
    middleware: Middleware | None = None,
    **overrides: Any,
) -> AsyncIterator[str]:
    settings = dataclasses.replace(EmulatorSettings(tokenizer_dir=tokenizer_dir), **overrides)
    app = build_app(settings, model)
    if middleware is not None:
        app.middlewares.append(middleware)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def _no_send(topic: str, key: bytes, value: bytes) -> None:
    raise AssertionError("nothing is sent in these tests")


async def started_concurrency(url: str, concurrency: Any) -> int:
    settings = GenerateSettings(
        server=url, kafka=KafkaSettings(bootstrap="127.0.0.1:9"), concurrency=concurrency
    )
    worker = GenerateWorker(
        settings, HttpServerClient(settings), _no_send, "c", "d", backoff=generate_backoff(settings)
    )
    await worker.start()
    try:
        return worker.concurrency
    finally:
        await worker.stop()


@pytest.mark.parametrize("middleware", [None, older_server], ids=["server_info", "get_server_info"])
def test_auto_keeps_the_servers_cap_in_flight(
    tiny_tokenizer_dirs: dict[str, Path],
    emulated_models: dict[str, EmulatedModel],
    middleware: Middleware | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        dirs, models = tiny_tokenizer_dirs["qwen36"], emulated_models["qwen36"]
        async with emulator(dirs, models, middleware, max_running_requests=12) as url:
            assert await started_concurrency(url, "auto") == 12
            # a number given is kept, whatever the server runs
            assert await started_concurrency(url, 5) == 5

    caplog.set_level(logging.INFO, logger="streams.generate")
    asyncio.run(scenario())
    assert any("12 in flight" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_auto_falls_back_to_the_default_when_the_server_does_not_say(
    tiny_tokenizer_dirs: dict[str, Path],
    emulated_models: dict[str, EmulatedModel],
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        dirs, models = tiny_tokenizer_dirs["qwen36"], emulated_models["qwen36"]
        async with emulator(dirs, models) as url:  # no cap: it says none
            assert await started_concurrency(url, "auto") == DEFAULT_CONCURRENCY

    caplog.set_level(logging.WARNING, logger="streams.generate")
    asyncio.run(scenario())
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "max_running_requests" in warnings[0] and str(DEFAULT_CONCURRENCY) in warnings[0]


def _parsed(*flags: str) -> GenerateSettings:
    argv = ["worker", "generate", "--server", "http://s", "--bootstrap", "k:1", *flags]
    return build(GenerateSettings, build_parser().parse_args(argv))


def test_concurrency_flag() -> None:
    assert _parsed("--concurrency", "auto").concurrency == "auto"
    assert _parsed("--concurrency", "AUTO").concurrency == "auto"
    assert _parsed("--concurrency", "7").concurrency == 7
    assert _parsed().concurrency == DEFAULT_CONCURRENCY == 32


@pytest.mark.parametrize("bad", ["0", "-3", "lots", "2.5", ""])
def test_bad_concurrency_is_one_line(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _parsed("--concurrency", bad)
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "--concurrency" in error and "positive integer or 'auto'" in error


def test_concurrency_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTGEN_CONCURRENCY", "auto")
    assert (
        GenerateSettings(server="http://s", kafka=KafkaSettings(bootstrap="k:1")).concurrency
        == "auto"
    )
