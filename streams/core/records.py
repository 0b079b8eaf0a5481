"""The records on the three topics; the one place they are encoded and decoded.

Every value is orjson with ``"v": 1``; keys are the ``prompt_id`` as UTF-8.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

import orjson

SCHEMA_VERSION = 1

Message = dict[str, Any]


# dead-letter kinds of the sample policy (streams/tokenize/policies.py): drops, not failures
POLICY_PREFIX = "policy_"


def is_policy_drop(kind: str) -> bool:
    return kind.startswith(POLICY_PREFIX)


class RecordError(ValueError):
    """A value that is not a valid record; `kind` names the failure for dead letters."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


T = TypeVar("T", bound="_Record")


class _Record:
    _required: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"v": SCHEMA_VERSION, **asdict(self)}  # type: ignore[call-overload]

    def encode(self) -> bytes:
        return orjson.dumps(self.to_dict())

    @classmethod
    def from_dict(cls: type[T], data: Any) -> T:
        if not isinstance(data, dict):
            raise RecordError("bad_shape", f"expected a JSON object, got {type(data).__name__}")
        version = data.get("v", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise RecordError("bad_version", f"schema version {version!r} is not {SCHEMA_VERSION}")
        missing = [name for name in cls._required if name not in data]
        if missing:
            raise RecordError("bad_shape", f"missing field(s): {', '.join(missing)}")
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        # Unknown fields are ignored so that producers may add fields before consumers know them.
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def decode(cls: type[T], raw: bytes) -> T:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as err:
            kind = "invalid_utf8" if "utf-8" in str(err).lower() else "not_json"
            raise RecordError(kind, str(err)) from None
        return cls.from_dict(data)


@dataclass
class PromptRecord(_Record):
    _required: ClassVar[tuple[str, ...]] = ("prompt_id", "messages")

    prompt_id: str
    messages: list[Message]
    source: str = ""
    tools: list[dict[str, Any]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    published_at: float = field(default_factory=time.time)


@dataclass
class CompletionRecord(_Record):
    """The prompt, the generated turn, and how it was made. Source of truth for replay."""

    _required: ClassVar[tuple[str, ...]] = ("prompt_id", "messages")

    prompt_id: str
    messages: list[Message]
    source: str = ""
    tools: list[dict[str, Any]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    published_at: float = 0.0
    # the generated assistant turn
    reasoning_content: str | None = None
    content: str = ""
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    # the server's own token ids, when it returned them
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] | None = None
    model: str = ""
    server: str = ""
    sampling: dict[str, Any] = field(default_factory=dict)
    latency_s: float = 0.0
    completed_at: float = field(default_factory=time.time)

    @classmethod
    def from_prompt(cls, prompt: PromptRecord, **generated: Any) -> CompletionRecord:
        return cls(
            prompt_id=prompt.prompt_id,
            messages=prompt.messages,
            source=prompt.source,
            tools=prompt.tools,
            meta=prompt.meta,
            published_at=prompt.published_at,
            **generated,
        )

    def generated_message(self) -> Message:
        """The generated turn as an OpenAI assistant message."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


@dataclass
class DeadLetter(_Record):
    """A record a stage could not turn into output, with the reason and the original payload."""

    _required: ClassVar[tuple[str, ...]] = ("stage", "kind", "message")

    stage: str
    kind: str
    message: str
    payload: str = ""
    prompt_id: str | None = None
    at: float = field(default_factory=time.time)

    @classmethod
    def for_payload(
        cls, stage: str, kind: str, message: str, raw: bytes, prompt_id: str | None = None
    ) -> DeadLetter:
        # Keep undecodable bytes visible rather than failing again while dead-lettering.
        return cls(
            stage=stage,
            kind=kind,
            message=message[:2000],
            payload=raw.decode("utf-8", errors="backslashreplace"),
            prompt_id=prompt_id,
        )
