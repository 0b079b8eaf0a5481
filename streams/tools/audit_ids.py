"""What `draftgen audit` keeps of each record: prompt ids as 64-bit hashes (`HashedIds`), and of
a completion only its prompt, its generation settings and the `published_at` of the prompt copy
it answers (`completion_facts`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from streams.core.ledger import REGENERATE, settings_hash
from streams.core.recipes import thinking_sent
from streams.core.turns import EVERY_TURN, FINAL, parse_turn_id

# hashes gathered in a Python list before they become an array
_CHUNK = 65_536

Hashes = npt.NDArray[np.int64]


class HashedIds:
    """A set of strings kept as their 64-bit hashes, 8 bytes each once compacted. Python's
    `hash` of a str is salted per process: fine within one audit. A collision (~1e-7 at the
    seed run's size) would hide one prompt without an outcome."""

    def __init__(self) -> None:
        self._new: list[int] = []
        self._chunks: list[Hashes] = []
        self._kept: Hashes = np.empty(0, dtype=np.int64)  # sorted, unique

    def add(self, text: object) -> None:
        """A str, or a tuple of them (a prompt id and the copy it answers)."""
        self._new.append(hash(text))
        if len(self._new) >= _CHUNK:
            self._flush()

    def add_hashes(self, hashes: Hashes) -> None:
        self._chunks.append(hashes)
        self._compact(force=False)

    def sorted(self) -> Hashes:
        """Every id added, hashed: sorted and unique."""
        self._flush()
        self._compact(force=True)
        return self._kept

    def __len__(self) -> int:
        return len(self.sorted())

    def __contains__(self, text: object) -> bool:
        return bool(self.contains(np.array([hash(text)], dtype=np.int64))[0])

    def contains(self, hashes: Hashes) -> npt.NDArray[np.bool_]:
        kept = self.sorted()
        if not len(kept):
            return np.zeros(len(hashes), dtype=bool)
        at = np.searchsorted(kept, hashes).clip(max=len(kept) - 1)
        return np.asarray(kept[at] == hashes)

    def _flush(self) -> None:
        if self._new:
            self._chunks.append(np.array(self._new, dtype=np.int64))
            self._new = []
            self._compact(force=False)

    def _compact(self, force: bool) -> None:
        # once the new hashes outgrow the kept ones: amortized, and repeats (an id written
        # many times) do not grow memory
        pending = sum(len(chunk) for chunk in self._chunks)
        if pending and (force or pending >= max(len(self._kept), _CHUNK)):
            self._kept = sorted_unique(np.concatenate([self._kept, *self._chunks]))
            self._chunks = []


def sorted_unique(hashes: Hashes) -> Hashes:
    # a sort and a neighbour test: several times faster than np.unique (numpy 2.3 hashes)
    hashes.sort()
    if len(hashes) < 2:
        return hashes
    keep = np.empty(len(hashes), dtype=bool)
    keep[0] = True
    np.not_equal(hashes[1:], hashes[:-1], out=keep[1:])
    return hashes[keep]


def union(sets: list[HashedIds]) -> HashedIds:
    joined = HashedIds()
    for ids in sets:
        joined.add_hashes(ids.sorted().copy())
    return joined


@dataclass(frozen=True, slots=True)
class CompletionFacts:
    own_id: str  # the completion's own prompt id (a turn's id with `--regen every-turn`)
    prompt_id: str  # the prompt it answers: a turn's conversation
    settings: str  # streams/core/ledger.py `settings_hash`, as the generate worker computed it
    published_at: float  # of the prompt copy it answers
    model: str


def completion_facts(key: bytes | None, value: bytes | None) -> CompletionFacts | None:
    """None for a value that is no completion (the tokenize stage dead-letters it)."""
    try:
        data = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        return None
    # the tokenize stage keys a window's rows by the record's own prompt_id
    own = data.get("prompt_id")
    prompt_id = own if isinstance(own, str) and own else (key or b"").decode("utf-8", "replace")
    if not prompt_id:
        return None
    turn = parse_turn_id(prompt_id)
    published = data.get("published_at")
    return CompletionFacts(
        own_id=prompt_id,
        prompt_id=turn[0] if turn is not None else prompt_id,
        settings=completion_settings(data, every_turn=turn is not None),
        published_at=float(published) if isinstance(published, int | float) else 0.0,
        model=str(data.get("model") or ""),
    )


def completion_settings(data: dict[str, Any], every_turn: bool = False) -> str:
    """The generation settings of a completion, hashed as the generate worker hashed its ledger
    key (streams/generate/once.py `settings_key`): the model, the sampling parameters it
    records (less `chat_template_kwargs`, which carries the thinking switch), thinking, and the
    regen mode (its prompt's meta; a turn's meta has it removed: a turn id is every-turn)."""
    given = data.get("sampling")
    sampling = dict(given) if isinstance(given, dict) else {}
    sent = thinking_sent(sampling)
    sampling.pop("chat_template_kwargs", None)
    thinking = True if sent is None else sent
    meta = data.get("meta")
    regen = str(meta.get("regen") or FINAL) if isinstance(meta, dict) else FINAL
    return settings_hash(
        str(data.get("model") or ""), sampling, thinking, EVERY_TURN if every_turn else regen
    )


def published_at(value: bytes | None, regenerate: bool) -> float | None:
    """A prompt copy's `published_at`; None for a copy without meta `regenerate` when
    `regenerate` is asked (tested on the bytes first: most copies are not decoded)."""
    if regenerate and REGENERATE.encode() not in (value or b""):
        return None
    try:
        data = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None
    meta = data.get("meta") if isinstance(data, dict) else None
    if regenerate and not (isinstance(meta, dict) and meta.get(REGENERATE) is True):
        return None
    published = data.get("published_at") if isinstance(data, dict) else None
    return float(published) if isinstance(published, int | float) else None
