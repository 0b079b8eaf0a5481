"""Records with one field of the wrong type or out of range, shared by the unit tests of the
decode point and the integration test that drives them through every stage."""

from __future__ import annotations

from typing import Any

import orjson

# a value of the wrong type (or range) for each field of a prompt record, with its kind
PROMPT_FIELDS: dict[str, tuple[Any, str]] = {
    "prompt_id": (7, "bad_shape"),
    "messages": ({"role": "user"}, "bad_shape"),
    "source": (3, "bad_shape"),
    "tools": ("run_shell", "bad_shape"),
    "meta": (["row", 1], "bad_shape"),
    "published_at": ("yesterday", "bad_shape"),
    "source_id": (12, "bad_shape"),
    "policy": ({"sampling": {"top_p": 0}}, "bad_policy"),
}

# the generated part of a completion record
COMPLETION_FIELDS: dict[str, tuple[Any, str]] = {
    **PROMPT_FIELDS,
    "reasoning_content": (["thought"], "bad_shape"),
    "content": (None, "bad_shape"),
    "tool_calls": ({"id": "c"}, "bad_shape"),
    "finish_reason": (1, "bad_shape"),
    "usage": ({"total_tokens": "12"}, "bad_shape"),
    "prompt_token_ids": ([1, "2"], "bad_token_ids"),
    "output_token_ids": ([5, -3], "bad_token_ids"),
    "model": (False, "bad_shape"),
    "server": ({"url": "x"}, "bad_shape"),
    "sampling": ("hot", "bad_shape"),
    "normalization": (["sglang-0.5.23"], "bad_shape"),
    "latency_s": (-1.0, "bad_shape"),
    "completed_at": (True, "bad_shape"),
    "recipe": (["code"], "bad_shape"),
    "served": ("sglang", "bad_shape"),
}

DEAD_LETTER_FIELDS: dict[str, tuple[Any, str]] = {
    "stage": ("", "bad_shape"),
    "kind": (4, "bad_shape"),
    "message": (["m"], "bad_shape"),
    "payload": (5, "bad_shape"),
    "payload_b64": (6, "bad_shape"),
    "payload_size": (-1, "bad_shape"),
    "payload_sha256": (7, "bad_shape"),
    "payload_truncated": ("yes", "bad_shape"),
    "origin": (8, "bad_shape"),
    "prompt_id": (9, "bad_shape"),
    "at": ("now", "bad_shape"),
    "source_id": (10, "bad_shape"),
}

# whole values of the wrong shape, with the kind each becomes
BAD_SHAPES: dict[str, tuple[bytes, str]] = {
    "not_json": (b"{not json", "not_json"),
    "invalid_utf8": (b'{"v": 1, "prompt_id": "\xff", "messages": []}', "invalid_utf8"),
    "array": (b"[1, 2, 3]", "bad_shape"),
    "string": (b'"a string"', "bad_shape"),
    "null": (b"null", "bad_shape"),
    "missing_fields": (b'{"v": 1, "something": "else"}', "bad_shape"),
    "version": (b'{"v": 2, "prompt_id": "p", "messages": []}', "bad_version"),
}


def prompt_dict(prompt_id: str, text: str = "What is a write-ahead log?") -> dict[str, Any]:
    return {
        "v": 1,
        "prompt_id": prompt_id,
        "messages": [{"role": "user", "content": text}],
        "source": "tests",
        "tools": None,
        "meta": {"row": 1},
        "published_at": 1.0,
        "source_id": "row-1",
        "policy": {"recipe": "mix", "sampling": {"temperature": 0.6}, "thinking": False},
    }


def completion_dict(prompt_id: str) -> dict[str, Any]:
    return {
        **prompt_dict(prompt_id),
        "reasoning_content": "thinking",
        "content": "an answer",
        "tool_calls": None,
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5},
        "prompt_token_ids": [1, 2],
        "output_token_ids": [3, 4, 5],
        "model": "m",
        "server": "http://s",
        "sampling": {"temperature": 1.0},
        "normalization": "sglang-0.5.23",
        "latency_s": 0.5,
        "completed_at": 2.0,
        "recipe": "mix",
        "served": {"kind": "sglang", "version": "0.5.23"},
    }


def dead_letter_dict() -> dict[str, Any]:
    return {
        "v": 1,
        "stage": "generate",
        "kind": "k",
        "message": "m",
        "payload": "",
        "payload_b64": None,
        "payload_size": 0,
        "payload_sha256": None,
        "payload_truncated": False,
        "origin": "prompts-0@1",
        "prompt_id": "p",
        "at": 1.0,
        "source_id": None,
    }


def with_field(record: dict[str, Any], name: str, value: Any) -> bytes:
    return orjson.dumps({**record, name: value})
