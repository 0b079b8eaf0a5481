"""Fixtures for the compose tests: tiny tokenizer directories, emulated servers in-process."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from compose.emulator import EmulatorSettings, build_app
from compose.emulator.engine import ENGINE_KEY, Engine
from compose.emulator.model import EmulatedModel
from compose.tiny_tokenizers import TINY_MODELS

# each family's tiny model by the model's name ("qwen36", "kimi_k26"): the emulated models
TOKENIZER_BUILDERS: dict[str, Callable[[Path], Path]] = {
    model.name: model.build for model in TINY_MODELS.values()
}


@pytest.fixture(scope="session")
def tiny_tokenizer_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both families' tiny tokenizer directories, built once per session."""
    return {
        name: build(tmp_path_factory.mktemp(f"tok-{name}"))
        for name, build in TOKENIZER_BUILDERS.items()
    }


@pytest.fixture(scope="session")
def qwen36_tokenizer_dir(tiny_tokenizer_dirs: dict[str, Path]) -> Path:
    return tiny_tokenizer_dirs["qwen36"]


@pytest.fixture(scope="session")
def kimi_k26_tokenizer_dir(tiny_tokenizer_dirs: dict[str, Path]) -> Path:
    return tiny_tokenizer_dirs["kimi_k26"]


@pytest.fixture(scope="session")
def emulated_models(tiny_tokenizer_dirs: dict[str, Path]) -> dict[str, EmulatedModel]:
    """Loaded once: each test's emulator reuses the tokenizer instead of loading it again."""
    return {name: EmulatedModel(path) for name, path in tiny_tokenizer_dirs.items()}


@pytest.fixture(params=sorted(TOKENIZER_BUILDERS))
def family(request: pytest.FixtureRequest) -> str:
    """Run a test once per target family."""
    return str(request.param)


@dataclass
class EmulatorHandle:
    base_url: str  # http://127.0.0.1:PORT, without /v1
    app: web.Application

    @property
    def engine(self) -> Engine:
        return self.app[ENGINE_KEY]

    @property
    def model(self) -> EmulatedModel:
        return self.engine.model


StartEmulator = Callable[..., contextlib.AbstractAsyncContextManager[EmulatorHandle]]


@pytest.fixture
def start_emulator(
    tiny_tokenizer_dirs: dict[str, Path], emulated_models: dict[str, EmulatedModel]
) -> StartEmulator:
    """`async with start_emulator("qwen36", rate_503=1.0) as emu:` a server on a free port."""

    @contextlib.asynccontextmanager
    async def start(name: str, **overrides: Any) -> AsyncIterator[EmulatorHandle]:
        settings = EmulatorSettings(tokenizer_dir=tiny_tokenizer_dirs[name])
        settings = dataclasses.replace(settings, **overrides)
        server = TestServer(build_app(settings, emulated_models[name]), host="127.0.0.1")
        await server.start_server()
        try:
            yield EmulatorHandle(str(server.make_url("")).rstrip("/"), server.app)
        finally:
            await server.close()

    return start
