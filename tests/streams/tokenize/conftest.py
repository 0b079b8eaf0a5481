"""Fixtures of the SampleBuilder tests: each target family's tiny tokenizer and profile."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streams.core.families import detect_family
from tests.streams.tokenize.sample_cases import FAMILIES, Family


@pytest.fixture(scope="session")
def families(
    qwen36_tokenizer_dir: Path, kimi_k26_tokenizer_dir: Path, load_tokenizer: Callable[[Path], Any]
) -> dict[str, Family]:
    dirs = {"qwen36": qwen36_tokenizer_dir, "kimi_k26": kimi_k26_tokenizer_dir}
    return {name: Family(name, d, load_tokenizer(d), detect_family(d)) for name, d in dirs.items()}


@pytest.fixture(params=FAMILIES)
def fam(request: pytest.FixtureRequest, families: dict[str, Family]) -> Family:
    return families[request.param]
