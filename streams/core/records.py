"""The records on the three topics; the one place they are encoded and decoded.

Every value is orjson with ``"v": 1``; keys are the ``prompt_id`` as UTF-8.

A completion's token ids are written packed (see `pack_ids`): a 128K-token output is 700 KB
of base64 instead of ~830 KB of JSON numbers (6-digit ids), and decodes in one numpy call
into a uint32 array that the tokenize stage passes on to Arrow without a Python int per token.
Records written before, with JSON lists under ``prompt_token_ids`` / ``output_token_ids``,
are still read (as lists).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt
import orjson

from streams.core.recipes import Policy, thinking_sent
from streams.core.record_fields import (
    PACKED_IDS,
    Check,
    RecordError,
    boolean,
    count,
    equal_fields,
    json_object,
    meta,
    nonempty_text,
    objects,
    optional,
    pack_ids,
    seconds,
    text,
    token_ids,
    unpack_ids,
    usage,
)

SCHEMA_VERSION = 1

Message = dict[str, Any]
# token ids: a list where they are made (the generate client, old records), a read-only uint32
# array where packed ids are decoded
TokenIds = list[int] | npt.NDArray[np.uint32]


# dead-letter kinds of the sample policy (streams/tokenize/policies.py): drops, not failures
POLICY_PREFIX = "policy_"


def is_policy_drop(kind: str) -> bool:
    return kind.startswith(POLICY_PREFIX)


T = TypeVar("T", bound="_Record")


class _Record:
    _required: ClassVar[tuple[str, ...]] = ()
    # every field's check; a field without one is a bug (see `_check_fields`)
    _checks: ClassVar[dict[str, Check]] = {}
    # the dead-letter kind of a failed check, per field (default "bad_shape")
    _check_kinds: ClassVar[dict[str, str]] = {}

    def to_dict(self) -> dict[str, Any]:
        # shallow: orjson walks the nested values itself; asdict's deep copy took 85 ms for
        # a 128K-id list
        values = {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]
        return {"v": SCHEMA_VERSION, **values}

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
        values = {k: v for k, v in data.items() if k in known}
        for name, value in values.items():
            problem = cls._checks[name](value)
            if problem is not None:
                kind = cls._check_kinds.get(name, "bad_shape")
                raise RecordError(kind, f"field {name!r}: {problem}")
        return cls(**values)

    @classmethod
    def decode(cls: type[T], raw: bytes) -> T:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as err:
            kind = "invalid_utf8" if "utf-8" in str(err).lower() else "not_json"
            raise RecordError(kind, str(err)) from None
        return cls.from_dict(data)


def _policy(value: Any) -> str | None:
    try:
        Policy.from_dict(value)
    except RecordError as err:
        return err.message
    return None


_PROMPT_CHECKS: dict[str, Check] = {
    "prompt_id": nonempty_text,
    "messages": objects,  # roles and contents: streams/core/normalize.validate_prompt_messages
    "source": text,
    "source_id": optional(text),
    "tools": optional(objects),
    "meta": meta,
    "published_at": seconds,
    "policy": optional(_policy),
}


@dataclass
class PromptRecord(_Record):
    _required: ClassVar[tuple[str, ...]] = ("prompt_id", "messages")
    _checks: ClassVar[dict[str, Check]] = _PROMPT_CHECKS
    _check_kinds: ClassVar[dict[str, str]] = {"policy": "bad_policy"}

    prompt_id: str
    messages: list[Message]
    # the source's name (a file name or an `hf:` spec), never a path of the publishing machine
    source: str = ""
    tools: list[dict[str, Any]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    published_at: float = field(default_factory=time.time)
    # the source row's own id (its `id`, or `--id-field`), so samples join back to the user's
    # data; None when the row has none (and in records written before the field existed)
    source_id: str | None = None
    # its recipe's sampling and thinking (streams/core/recipes.py); None: the worker's settings
    policy: dict[str, Any] | None = None

    def generation_policy(self) -> Policy | None:
        return None if self.policy is None else Policy.from_dict(self.policy)


@dataclass
class CompletionRecord(_Record):
    """The prompt, the generated turn, and how it was made. Source of truth for replay."""

    _required: ClassVar[tuple[str, ...]] = ("prompt_id", "messages")
    _checks: ClassVar[dict[str, Check]] = {
        **_PROMPT_CHECKS,
        "reasoning_content": optional(text),
        "content": text,
        "tool_calls": optional(objects),
        "finish_reason": optional(text),
        "usage": usage,
        "prompt_token_ids": optional(token_ids),
        "output_token_ids": optional(token_ids),
        "model": text,
        "server": text,
        "sampling": json_object,
        "normalization": text,
        "latency_s": seconds,
        "completed_at": seconds,
        "recipe": text,
        "served": json_object,
    }
    _check_kinds: ClassVar[dict[str, str]] = {
        "prompt_token_ids": "bad_token_ids",
        "output_token_ids": "bad_token_ids",
        "policy": "bad_policy",
    }

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
    prompt_token_ids: TokenIds | None = None
    output_token_ids: TokenIds | None = None
    model: str = ""
    server: str = ""
    sampling: dict[str, Any] = field(default_factory=dict)
    # the server's preprocessing profile the prompt was rendered with (streams/core/serving/);
    # "" in records written before profiles: the newest
    normalization: str = ""
    latency_s: float = 0.0
    completed_at: float = field(default_factory=time.time)
    source_id: str | None = None  # the prompt's (PromptRecord.source_id)
    policy: dict[str, Any] | None = None  # the prompt's (PromptRecord.policy)
    # provenance: the recipe's name ("" without one) and who answered: the server's kind and
    # version, and the model revision when the server reports one
    recipe: str = ""
    served: dict[str, Any] = field(default_factory=dict)

    def __eq__(self, other: object) -> bool:
        # decoded ids are arrays: compared by value, equal to the same ids as a list
        if not isinstance(other, CompletionRecord):
            return NotImplemented
        return equal_fields(self, other)

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        for name, packed_name in PACKED_IDS.items():
            packed = pack_ids(data[name])
            if packed is not None:
                del data[name]
                data[packed_name] = packed
        return data

    @classmethod
    def from_dict(cls, data: Any) -> CompletionRecord:
        if isinstance(data, dict) and any(name in data for name in PACKED_IDS.values()):
            data = dict(data)
            for name, packed_name in PACKED_IDS.items():
                if packed_name in data:
                    data[name] = unpack_ids(data.pop(packed_name))
        return super().from_dict(data)

    @classmethod
    def from_prompt(cls, prompt: PromptRecord, **generated: Any) -> CompletionRecord:
        return cls(
            prompt_id=prompt.prompt_id,
            messages=prompt.messages,
            source=prompt.source,
            tools=prompt.tools,
            meta=prompt.meta,
            published_at=prompt.published_at,
            source_id=prompt.source_id,
            policy=prompt.policy,
            **generated,
        )

    def provenance_fields(self) -> dict[str, Any]:
        """What made it (a shard row's and an export's `provenance`): the model, who served
        it, its recipe, the sampling parameters sent and the thinking switch among them, and
        the preprocessing profile its prompt was rendered with."""
        return {
            "model": self.model,
            "served": self.served,
            "recipe": self.recipe,
            "sampling": self.sampling,
            "thinking": thinking_sent(self.sampling or {}),
            "normalization": self.normalization,
        }

    def provenance(self, tokenized_with: dict[str, str] | None = None) -> str:
        """`provenance_fields` and what tokenized it (the tokenizer's and chat template's
        hashes) as JSON, keys sorted: the shards' column."""
        fields = {**self.provenance_fields(), **(tokenized_with or {})}
        return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS).decode()

    def generated_message(self) -> Message:
        """The generated turn as an OpenAI assistant message."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def origin_of(topic: str, partition: int, offset: int) -> str:
    """Where a consumed record is, as a dead letter's `origin` (Kafka's topic-partition@offset)."""
    return f"{topic}-{partition}@{offset}"


# a prompt id longer than this is cut in its dead letter (it is also the letter's Kafka key)
MAX_LETTER_PROMPT_ID = 1024
# the kinds of a publish dead letter whose row was fine but removed on purpose
# (producers/clean.py): counted apart from rejections, never republished unless named
REMOVED_KINDS = frozenset({"duplicate_text", "near_duplicate", "contaminated"})


@dataclass
class DeadLetter(_Record):
    """A record a stage could not turn into output, with the reason and the original payload.

    The payload is kept as text when it is valid UTF-8 (readable on the topic), else as base64
    (`payload_b64`): never an escaping that grows it several times. `payload_size` and
    `payload_sha256` describe the whole original; `encode_within` cuts a payload that would make
    the letter larger than Kafka accepts (`payload_truncated`), and `origin` says where the whole
    record still is (topic, partition, offset) while the topic retains it. Letters written
    before these fields have only `payload` (undecodable bytes as ``\\xNN`` text).
    """

    _required: ClassVar[tuple[str, ...]] = ("stage", "kind", "message")
    _checks: ClassVar[dict[str, Check]] = {
        "stage": nonempty_text,
        "kind": nonempty_text,
        "message": text,
        "payload": text,
        "payload_b64": optional(text),
        "payload_size": optional(count),
        "payload_sha256": optional(text),
        "payload_truncated": boolean,
        "origin": optional(text),
        "prompt_id": optional(text),
        "at": seconds,
        "source_id": optional(text),
    }

    stage: str
    kind: str
    message: str
    payload: str = ""
    payload_b64: str | None = None
    payload_size: int | None = None
    payload_sha256: str | None = None
    payload_truncated: bool = False
    origin: str | None = None
    prompt_id: str | None = None
    at: float = field(default_factory=time.time)
    # the source row's own id, when known where the letter is written (a rejected source row);
    # letters of later stages have it in their payload (`failed_prompt`)
    source_id: str | None = None

    @classmethod
    def for_payload(
        cls,
        stage: str,
        kind: str,
        message: str,
        raw: bytes,
        prompt_id: str | None = None,
        origin: str | None = None,
    ) -> DeadLetter:
        try:
            payload, payload_b64 = raw.decode("utf-8"), None
        except UnicodeDecodeError:
            payload, payload_b64 = "", base64.b64encode(raw).decode("ascii")
        return cls(
            stage=stage,
            kind=kind,
            message=message[:2000],
            payload=payload,
            payload_b64=payload_b64,
            payload_size=len(raw),
            payload_sha256=hashlib.sha256(raw).hexdigest(),
            origin=origin,
            prompt_id=None if prompt_id is None else prompt_id[:MAX_LETTER_PROMPT_ID],
        )

    def payload_bytes(self) -> bytes:
        """The payload as it was kept (all of it unless `payload_truncated`)."""
        if self.payload_b64 is None:
            return self.payload.encode()
        try:
            return base64.b64decode(self.payload_b64, validate=True)
        except (binascii.Error, ValueError) as err:
            raise RecordError("bad_payload", f"payload_b64 is not base64: {err}") from None

    def encode_within(self, max_bytes: int) -> bytes:
        """The letter encoded in at most `max_bytes` (0: without its payload), its payload
        cut as needed (as base64, whose size is exact; the letter itself is not changed)."""
        if max_bytes > 0 and len(whole := self.encode()) <= max_bytes:
            return whole
        cut = replace(self, payload="", payload_b64="", payload_truncated=True)
        room = max(max_bytes - len(cut.encode()), 0)
        kept = self.payload_bytes()[: room // 4 * 3]
        return replace(cut, payload_b64=base64.b64encode(kept).decode("ascii")).encode()
