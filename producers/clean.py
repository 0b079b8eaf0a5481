"""Clean prompts before they cost GPU time: the same text published twice, nearly the same
text, and prompts that contain an evaluation task.

- ``duplicate_text``: the prompt's text, normalized (Unicode NFKC, whitespace collapsed, the
  roles kept), equals an earlier prompt's of this publish, across all its sources. A prompt id
  hashes the exact content, so two rows that differ only in whitespace are two prompt ids; this
  catches them. The first one is published.
- ``near_duplicate`` (off unless ``--near-duplicates`` gives a threshold): the prompt's word
  5-grams, system messages and tools left out (prompts of one agent share those), have an
  estimated Jaccard similarity at or above the threshold with an earlier prompt's. MinHash
  signatures and LSH band parameters come from datasketch; the index keeps only the first
  prompt of each band bucket (datasketch's MinHashLSH keeps a set per bucket, ~3 KB a prompt).
  LSH is probabilistic: a pair well above the threshold is almost always found, a pair well
  below it rarely (docs/data.md has the curve).
- ``contaminated``: the prompt shares a word n-gram (``--contamination-ngram``, 13 words by
  default, lowercased, as the GPT-3 and Llama reports check) with an evaluation set given with
  ``--decontaminate``. Every string of an evaluation row is a text of its own; a string shorter
  than the n-gram is not checked (it would match common phrases).

Each removal is a dead letter of stage ``publish`` (its row, the reason and the match in its
message), counted apart from rejections in the summary. Memory grows with distinct prompts,
never with their length: ~85 bytes a prompt for the text dedup, ~0.6 KB with near
duplicates (BENCHMARKS.md), and the evaluation sets' n-grams.
"""

from __future__ import annotations

import re
import unicodedata
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from streams.core.records import PromptRecord, RecordError

DEFAULT_NGRAM = 13
SHINGLE = 5  # words a near-duplicate shingle, as the BigCode and SlimPajama dedups use
NUM_PERM = 128
_WORD = re.compile(r"\w+")


def _nfkc(text: str) -> str:
    return text if unicodedata.is_normalized("NFKC", text) else unicodedata.normalize("NFKC", text)


def _texts(value: Any) -> Iterator[str]:
    """Every string in a value (a row, a message's content parts), depth first."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


def normalized_text(record: PromptRecord) -> str:
    """The prompt as a reader sees it: each message's role and text, NFKC, whitespace
    collapsed; the tools' schemas too."""
    parts = [f"{m.get('role')}: {' '.join(_texts(m.get('content')))}" for m in record.messages]
    parts += [" ".join(_texts(record.tools))] if record.tools else []
    return " ".join(_nfkc("\n".join(parts)).split())


def words_of(text: str) -> list[str]:
    """The text's words, NFKC and lowercased: what n-grams and shingles are made of."""
    return _WORD.findall(_nfkc(text).lower())


def _grams(words: list[str], n: int) -> Iterator[tuple[str, ...]]:
    return (tuple(words[i : i + n]) for i in range(len(words) - n + 1))


@dataclass
class EvalNgrams:
    """The word n-grams of evaluation sets, each with the set it came from."""

    n: int = DEFAULT_NGRAM
    grams: dict[tuple[str, ...], str] = field(default_factory=dict)
    texts: int = 0

    def add(self, name: str, rows: Iterable[Any]) -> None:
        for row in rows:
            for text in _texts(row):
                self.texts += 1
                for gram in _grams(words_of(text), self.n):
                    self.grams.setdefault(gram, name)

    def match(self, text: str) -> tuple[str, str] | None:
        """The first n-gram of `text` found in a set: (set name, the words)."""
        # a tuple of str hashes from the strings' cached hashes: no joined string per n-gram
        for gram in _grams(words_of(text), self.n):
            name = self.grams.get(gram)
            if name is not None:
                return name, " ".join(gram)
        return None


class NearDuplicates:
    """The first prompt of each LSH bucket: a prompt that lands in an occupied bucket of any
    band is a near duplicate of the prompt that holds it."""

    def __init__(self, threshold: float, num_perm: int = NUM_PERM) -> None:
        from datasketch import MinHash, MinHashLSH

        self._minhash = MinHash
        self.num_perm = num_perm
        # the band split that minimises false positives and negatives at the threshold
        self._ranges = MinHashLSH(threshold=threshold, num_perm=num_perm).hashranges
        self._permutations = MinHash(num_perm, seed=1).permutations
        self._buckets: list[dict[int, int]] = [{} for _ in self._ranges]
        self._firsts: list[str] = []

    def _bands(self, words: list[str]) -> list[int]:
        shingles = {zlib.crc32(" ".join(g).encode()) for g in _grams(words, SHINGLE)}
        if not shingles:  # fewer words than a shingle: the words themselves
            shingles = {zlib.crc32(" ".join(words).encode())}
        signature = self._minhash(
            self.num_perm, permutations=self._permutations, hashfunc=int, scheme="affine32"
        )
        signature.update_batch(shingles)
        values = signature.hashvalues
        return [hash(values[start:end].tobytes()) for start, end in self._ranges]

    def check(self, prompt_id: str, words: list[str]) -> str | None:
        """The earlier prompt this one nearly duplicates, or None (and it is remembered)."""
        bands = self._bands(words)
        for bucket, key in zip(self._buckets, bands, strict=True):
            first = bucket.get(key)
            if first is not None:
                return self._firsts[first]
        index = len(self._firsts)
        self._firsts.append(prompt_id)
        for bucket, key in zip(self._buckets, bands, strict=True):
            bucket[key] = index
        return None


def conversation_words(record: PromptRecord) -> list[str]:
    """The words a near-duplicate compares: every message but the system's, no tools."""
    return words_of(
        " ".join(
            " ".join(_texts(m.get("content"))) for m in record.messages if m.get("role") != "system"
        )
    )


@dataclass
class PromptCleaner:
    """Decides, prompt by prompt in publish order, which to remove and why."""

    dedup_text: bool = True
    evals: EvalNgrams | None = None
    near: NearDuplicates | None = None
    # normalized text's hash (Python's: 64 bits, stable within the process, which is all a
    # publish compares) → the first prompt id with it
    _first: dict[int, str] = field(default_factory=dict)

    def check(self, record: PromptRecord) -> RecordError | None:
        """Why the prompt is not published (`contaminated`, `duplicate_text`,
        `near_duplicate`), or None. Called once per prompt id: a prompt that is removed is
        not remembered as a first."""
        text = normalized_text(record)
        if self.evals is not None and self.evals.grams:
            found = self.evals.match(text)
            if found is not None:
                name, gram = found
                return RecordError("contaminated", f"shares {gram!r} with evaluation set {name}")
        if self.dedup_text:
            first = self._first.setdefault(hash(text), record.prompt_id)
            if first != record.prompt_id:
                return RecordError(
                    "duplicate_text", f"the same text (whitespace aside) as prompt {first}"
                )
        if self.near is not None:
            near = self.near.check(record.prompt_id, conversation_words(record))
            if near is not None and near != record.prompt_id:
                return RecordError("near_duplicate", f"nearly the same text as prompt {near}")
        return None


def load_cleaner(
    dedup_text: bool,
    eval_sets: list[str],
    n: int = DEFAULT_NGRAM,
    storage_options: dict[str, Any] | None = None,
    near_duplicates: float | None = None,
) -> PromptCleaner:
    """The cleaner of a publish: its evaluation sets read now, so a bad one fails at start
    (FileNotFoundError, ValueError, as `iter_rows` raises)."""
    from producers.sources import iter_rows, parse_source_spec

    evals = EvalNgrams(n)
    for name in eval_sets:
        spec = parse_source_spec(name)
        # named as publish names a source: its file name, never a path of this machine
        shown = spec.path if spec.path.startswith("hf:") else PurePosixPath(spec.path).name
        evals.add(shown or spec.path, (row for _, row in iter_rows(spec, storage_options)))
    near = NearDuplicates(near_duplicates) if near_duplicates is not None else None
    return PromptCleaner(dedup_text, evals if eval_sets else None, near)
