"""The checks of a record's fields, and the packed form of token ids (streams/core/records.py
uses them; each check takes a field's decoded JSON value and returns what is wrong with it)."""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import numpy as np
import numpy.typing as npt

_UINT32 = np.dtype("<u4")


class RecordError(ValueError):
    """A value that is not a valid record; `kind` names the failure for dead letters."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


Check = Callable[[Any], str | None]


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def text(value: Any) -> str | None:
    return None if isinstance(value, str) else f"expected a string, got {_kind(value)}"


def nonempty_text(value: Any) -> str | None:
    return text(value) or (None if value else "is empty")


def optional(check: Check) -> Check:
    def optional_check(value: Any) -> str | None:
        return None if value is None else check(value)

    return optional_check


def json_object(value: Any) -> str | None:
    return None if isinstance(value, dict) else f"expected an object, got {_kind(value)}"


def objects(value: Any) -> str | None:
    if not isinstance(value, list):
        return f"expected a list, got {_kind(value)}"
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            return f"item {index}: expected an object, got {_kind(item)}"
    return None


def seconds(value: Any) -> str | None:
    """A time or duration: a finite number, not negative (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"expected a number, got {_kind(value)}"
    if not math.isfinite(value) or value < 0:
        return f"expected a finite number >= 0, got {value!r}"
    return None


def token_ids(value: Any) -> str | None:
    """Token ids: integers >= 0 (the vocabulary bound is the tokenizer's, checked there).
    One numpy conversion, not a Python loop per token."""
    if isinstance(value, np.ndarray) and value.dtype == _UINT32 and value.ndim == 1:
        return None  # unpacked: integers >= 0 by construction
    if not isinstance(value, list):
        return f"expected a list of token ids, got {_kind(value)}"
    if not value:
        return None
    try:
        ids = np.asarray(value)
    except ValueError:  # ragged nesting
        return "expected integer token ids, got nested lists"
    if ids.ndim != 1 or ids.dtype.kind not in "iu":  # floats, strings, bools, nested, huge
        return f"expected integer token ids, got {ids.dtype.name if ids.ndim == 1 else 'nested'}"
    if (lowest := int(ids.min())) < 0:
        return f"negative token id {lowest}"
    return None


def meta(value: Any) -> str | None:
    """Free-form, except the keys the stages read."""
    if problem := json_object(value):
        return problem
    for key, check in (("conversation_id", optional(text)), ("regen", optional(text))):
        if problem := check(value.get(key)):
            return f"{key}: {problem}"
    return None


def usage(value: Any) -> str | None:
    """Free-form, except the counts the stages read."""
    if problem := json_object(value):
        return problem
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        count = value.get(key)
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
            return f"{key}: expected an integer, got {_kind(count)}"
        if isinstance(count, int) and count < 0:
            return f"{key}: negative count {count}"
    return None


# JSON list field -> its packed field: base64 of the ids as little-endian uint32
PACKED_IDS = {
    "prompt_token_ids": "prompt_token_ids_u32",
    "output_token_ids": "output_token_ids_u32",
}


def pack_ids(ids: Any) -> str | None:
    """The ids as base64 of little-endian uint32, or None when they are not all integers in
    [0, 2**32) (such ids stay a JSON list, so the tokenize stage dead-letters them as now)."""
    if isinstance(ids, np.ndarray) and ids.dtype == _UINT32 and ids.ndim == 1:
        return base64.b64encode(ids.tobytes()).decode("ascii")  # unpacked: valid as it is
    if not isinstance(ids, list | np.ndarray):
        return None
    try:
        array = np.asarray(ids)
    except ValueError:  # ragged nesting
        return None
    if array.ndim != 1:
        return None
    if array.size and (
        array.dtype.kind not in "iu" or array.min() < 0 or array.max() > np.iinfo(_UINT32).max
    ):
        return None
    return base64.b64encode(array.astype(_UINT32).tobytes()).decode("ascii")


def unpack_ids(packed: Any) -> npt.NDArray[np.uint32]:
    """The inverse of `pack_ids`, as a read-only uint32 array (ids >= 0 by construction)."""
    if not isinstance(packed, str):
        raise RecordError("bad_token_ids", f"packed ids: expected a string, got {_kind(packed)}")
    try:
        raw = base64.b64decode(packed, validate=True)
    except (binascii.Error, ValueError) as err:
        raise RecordError("bad_token_ids", f"packed ids are not base64: {err}") from None
    if len(raw) % _UINT32.itemsize:
        raise RecordError("bad_token_ids", f"packed ids: {len(raw)} bytes is not whole uint32s")
    return np.frombuffer(raw, dtype=_UINT32)


def equal_fields(a: Any, b: Any) -> bool:
    """Dataclass equality where fields may be numpy arrays (compared by value, equal to the
    same values as a list): `==` on a tuple of arrays raises."""
    if type(a) is not type(b):
        return False
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if x is None or y is None or not np.array_equal(x, y):
                return False
        elif x != y:
            return False
    return True


def count(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"expected an integer, got {_kind(value)}"
    return None if value >= 0 else f"negative count {value}"


def boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"expected true or false, got {_kind(value)}"
