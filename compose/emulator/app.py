"""The aiohttp application: routes, and the informational endpoints."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from compose.emulator.chat import handle_chat
from compose.emulator.engine import ENGINE_KEY, Engine
from compose.emulator.errors import json_response
from compose.emulator.model import EmulatedModel
from compose.emulator.native import handle_generate, handle_tokenize
from compose.emulator.request_log import LOGGED_PATHS, RequestLog
from compose.emulator.settings import EmulatorSettings


def build_app(settings: EmulatorSettings, model: EmulatedModel | None = None) -> web.Application:
    """Load the tokenizer (blocking, as SGLang does before it listens) and wire the routes.

    `model` reuses an already loaded tokenizer (tests start many servers on one).
    """
    if model is None:
        model = EmulatedModel(settings.tokenizer_dir, settings.family)
    engine = Engine(settings, model)
    # a chat request with a long conversation is well over aiohttp's 1 MiB default
    middlewares: list[Any] = [_check_api_key]
    log = RequestLog(settings.request_log) if settings.request_log is not None else None
    if log is not None:
        middlewares.insert(0, _request_logger(log))
    app = web.Application(client_max_size=256 * 1024**2, middlewares=middlewares)
    app[ENGINE_KEY] = engine
    if log is not None:
        app.on_cleanup.append(log.cleanup)
    app.on_startup.append(_start_clock)
    app.router.add_post("/v1/chat/completions", handle_chat)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/stats", _stats)  # the emulator's own counters
    if settings.kind == "vllm":
        # vLLM's api_server: /health (503 while the engine cannot serve), /version
        app.router.add_get("/health", _engine_ready)
        app.router.add_get("/version", _version)
        return app
    app.router.add_post("/generate", handle_generate)
    app.router.add_post("/v1/tokenize", handle_tokenize)
    app.router.add_get("/health", _health)
    app.router.add_get("/health_generate", _health_generate)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, _model_info)
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, _server_info)
    return app


@web.middleware
async def _check_api_key(request: web.Request, handler: Any) -> web.StreamResponse:
    """SGLang's `add_api_key_middleware`: /health* and /metrics need no key; every other route
    wants the exact bearer key, else {"error": "Unauthorized"}. vLLM's wants it on /v1/* only.
    Read per request, so a test can change the key of a running server."""
    settings = request.app[ENGINE_KEY].settings
    if settings.api_key is None or request.method == "OPTIONS":
        return await handler(request)
    if request.path.startswith(("/health", "/metrics")):
        return await handler(request)
    if settings.kind == "vllm" and not request.path.startswith("/v1"):
        return await handler(request)
    if request.headers.get("Authorization") != f"Bearer {settings.api_key}":
        return json_response({"error": "Unauthorized"}, status=settings.auth_status)
    return await handler(request)


def _request_logger(log: RequestLog) -> Any:
    @web.middleware
    async def logged(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path not in LOGGED_PATHS:
            return await handler(request)
        return await log.around(request, handler)

    return logged


async def _start_clock(app: web.Application) -> None:
    engine = app[ENGINE_KEY]
    engine.ready_at = time.monotonic() + engine.settings.startup_delay_s


def _engine(request: web.Request) -> Engine:
    return request.app[ENGINE_KEY]


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _engine_ready(request: web.Request) -> web.Response:
    # vLLM's /health generates nothing: 503 only while the engine cannot serve
    return web.Response(status=200 if _engine(request).ready else 503)


async def _health_generate(request: web.Request) -> web.Response:
    # SGLang runs one token through the scheduler: 503 while loading, or after its timeout
    return web.Response(status=200 if await _engine(request).health_generate() else 503)


async def _models(request: web.Request) -> web.Response:
    settings = _engine(request).settings
    card: dict[str, Any] = {
        "id": settings.model,
        "object": "model",
        "created": int(time.time()),
        "owned_by": settings.kind,
        "root": settings.model,
        "parent": None,
        "max_model_len": settings.max_model_len,
    }
    return json_response({"object": "list", "data": [card]})


async def _model_info(request: web.Request) -> web.Response:
    engine = _engine(request)
    return json_response(
        {
            "model_path": str(engine.settings.tokenizer_dir),
            "tokenizer_path": str(engine.settings.tokenizer_dir),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": engine.model.family.name,
            "architectures": None,
        }
    )


async def _version(request: web.Request) -> web.Response:
    return json_response({"version": _engine(request).settings.version})


async def _server_info(request: web.Request) -> web.Response:
    return json_response(_engine(request).server_info())


async def _stats(request: web.Request) -> web.Response:
    return json_response(_engine(request).stats.to_dict())
