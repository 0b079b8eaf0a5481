"""Tiny Qwen3.6 and Kimi K2.6 tokenizer directories, built once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from compose.tiny_tokenizers import build_kimi_k26_tokenizer, build_qwen36_tokenizer


@pytest.fixture(scope="session")
def qwen36_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen36_tokenizer(tmp_path_factory.mktemp("tok") / "qwen36-tiny")


@pytest.fixture(scope="session")
def kimi_k26_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_kimi_k26_tokenizer(tmp_path_factory.mktemp("tok") / "kimi-k26-tiny")


@pytest.fixture(scope="session")
def load_tokenizer() -> Callable[[Path], Any]:
    """Loads a fresh tokenizer instance (Kimi's needs its remote code)."""

    def load(directory: Path) -> Any:
        return AutoTokenizer.from_pretrained(directory, trust_remote_code=True)

    return load
