"""Prompt sets and tokenizer directories for the integration tests."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from compose.tiny_tokenizers import build_qwen36_tokenizer

WORDS = [
    "refactor",
    "the",
    "parser",
    "so",
    "that",
    "errors",
    "carry",
    "line",
    "numbers;",
    "explain",
    "the",
    "trade-offs",
    "write",
    "a",
    "python",
    "function",
    "that",
    "merges",
    "overlapping",
    "intervals",
    "and",
    "test",
    "it",
    "summarize",
    "the",
    "design",
    "of",
    "a",
    "write-ahead",
    "log",
    "for",
    "a",
    "key",
    "value",
    "store",
    "why",
    "does",
    "my",
    "rust",
    "borrow",
    "checker",
    "complain",
    "about",
    "this",
    "closure",
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command in the repository",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))).capitalize() + "?"


def make_conversation(index: int, rng: random.Random) -> dict[str, Any]:
    """Multi-turn, with and without system prompts, some with tools and tool results."""
    messages: list[dict[str, Any]] = []
    if index % 3 == 0:
        messages.append({"role": "system", "content": f"You are assistant #{index}."})
    for _ in range(index % 3):
        messages.append({"role": "user", "content": _sentence(rng)})
        messages.append({"role": "assistant", "content": _sentence(rng)})
    messages.append({"role": "user", "content": f"[{index}] {_sentence(rng)}"})
    row: dict[str, Any] = {"messages": messages}
    if index % 5 == 0:
        row["tools"] = TOOLS
        call_id = f"call_{index}"
        messages += [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "run_shell", "arguments": '{"command": "ls"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": "README.md\nsrc\n"},
        ]
    return row


@pytest.fixture
def write_prompts(tmp_path: Path) -> Callable[..., Path]:
    def write(count: int, name: str = "prompts.jsonl", start: int = 0, seed: int = 7) -> Path:
        rng = random.Random(seed)
        path = tmp_path / name
        with path.open("wb") as handle:
            for index in range(start, start + count):
                handle.write(orjson.dumps(make_conversation(index, rng)) + b"\n")
        return path

    return write


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen36_tokenizer(tmp_path_factory.mktemp("tok") / "qwen36-tiny")
