"""Texts → token ids for the tokenize stage: the tokenizer's own batch encoder, or a tiktoken
twin of it, ~2.6× as fast on the same texts here (BENCHMARKS.md).

Hugging Face's byte-level BPE tokenizers of the shape Qwen's is (an NFC normalizer or none,
one regex split, byte-level bytes, added tokens matched as plain strings) give the ids
tiktoken's BPE core gives from the same vocabulary, with the added tokens split out first and
each piece between them normalized: tiktoken merges the pair whose result has the lowest id,
Hugging Face the pair listed first among the merges, and with merges listed in the order of
their results' ids (checked) the two agree on vocabularies made by BPE training, and on
merge lists converted from tiktoken ranks. The twin is built from the tokenizer's own
`tokenizer.json` only when it has that shape, and used only when it then encodes every
vocabulary token and a set of hard texts exactly as the tokenizer does.

It stays checked while it runs: one text of every batch is also encoded by the tokenizer, and
the sample builder has every drift confirmed by the tokenizer (samples.py), so a drift is
never the twin's. A difference anywhere switches the encoder to the tokenizer for good, with a
warning. `--encoder tokenizer` never builds the twin.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
import unicodedata
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import orjson
import tiktoken

from streams.core.tokenizers import unicode_to_byte

log = logging.getLogger(__name__)

EncoderChoice = Literal["auto", "tokenizer"]
# logged once a worker's twin is ready (benchmarks wait for it)
TWIN_READY = "encoding with a tiktoken twin of the tokenizer"
# vocabulary tokens per text in the twin's check (joined by an added token, which splits them)
CHECK_CHUNK = 2000
# texts a twin must encode exactly as the tokenizer: added tokens against text on both sides,
# NFC-sensitive marks (a combining overlay after '>' composes to '≯' in one piece, not across
# an added token), letters with marks, digits, whitespace runs, contractions, CJK, emoji.
HARD_TEXTS = (
    "Hello world! It's 2026; we'll see. I'M HERE, they'VE gone, you'D go.",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nok\n</think>\n\nyes",
    "x<|im_end|>\u0338 and <|endoftext|><|endoftext|>  <tool_call>\n{}\n</tool_call>",
    "e\u0301 \u00e9 a\u0308\u0304 \u1100\u1161\u11a8 \ufb01 \u212b \u0041\u030a \u0338=\u0338<",
    "12345678901234567890 3.14159 1,000,000 ١٢٣ ⅷ ²³",
    "def f(x):\n\t\treturn x  \n\n\n    \r\n\r\n  \t end   ",
    "漢字とかなカナ、한국어 텍스트。Ελληνικά русский עברית العربية हिन्दी",
    "emoji 👍🏽 👩‍👩‍👧 🇫🇷 \u200d\u200b\ufeff \x00\x01\x7f tabs\tand\u00a0nbsp",
    "'s's 'S 're\n'LL'll ''' \"\"\" `code` ~~~ ... ??? !!! ---",
)


class TextEncoder:
    """`encode_batch(texts)`: one list of ids per text, as the tokenizer encodes it without
    adding special tokens; `reference` is always the tokenizer's own."""

    def __init__(self, tokenizer: Any, choice: EncoderChoice = "auto") -> None:
        self.tokenizer = tokenizer
        # found on first use: a stage that never encodes (server ids, no drift) pays nothing
        self._undecided = choice == "auto"
        self._deciding = threading.Lock()
        self._twin: BpeTwin | None = None
        self._batches = 0

    @property
    def twin(self) -> bool:
        """The tiktoken twin encodes (else the tokenizer itself)."""
        return self._twin is not None

    def prepare(self) -> None:
        """Build and check the twin now, not at the first batch (idempotent, thread-safe)."""
        with self._deciding:
            if self._undecided:
                self._twin = _twin_of(self.tokenizer)
                self._undecided = False

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        self.prepare()
        twin = self._twin
        if twin is None:
            return self.reference(texts)
        ids = twin.encode_batch(texts)
        # one text a batch, a different one each time: the tokenizer must agree
        check = self._batches % len(texts)
        self._batches += 1
        if self.reference([texts[check]])[0] != ids[check]:
            self.disable("a text of a batch")
            return self.reference(texts)
        return ids

    def spells(
        self, ids: npt.NDArray[np.int32], text: str, *, normalized: bool = False
    ) -> bool | None:
        """Whether `ids` decode to `text` with the same added tokens at the same places, so
        that they are its encoding if they are canonical (a tokenizer's output, not a model's
        samples); `normalized`: and the text is as the normalizer leaves it (else no encoding
        spells it). None: this encoder cannot tell (no twin), encode the text instead."""
        self.prepare()
        twin = self._twin
        return None if twin is None else twin.spells(ids, text, normalized=normalized)

    def reference(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        tokenizer = self.tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            # The Rust batch encoder, parallel across texts; the `_fast` variant skips offsets.
            encode = getattr(backend, "encode_batch_fast", None) or backend.encode_batch
            return [e.ids for e in encode(list(texts), add_special_tokens=False)]
        model = getattr(tokenizer, "model", None)
        if isinstance(model, tiktoken.Encoding):
            # Kimi-style remote code: what its `encode(text)` does (and so the server), batched
            # on tiktoken's threads instead of the slow tokenizer's Python path.
            return model.encode_batch(list(texts), allowed_special="all")
        return [tokenizer.encode(text, add_special_tokens=False) for text in texts]

    def disable(self, where: str) -> None:
        """The twin differed from the tokenizer: the tokenizer encodes from now on."""
        self._undecided = False
        if self._twin is not None:
            log.warning(
                "the tiktoken encoder differs from the tokenizer on %s; "
                "encoding with the tokenizer itself from now on",
                where,
            )
        self._twin = None


class BpeTwin:
    """tiktoken's BPE core with the tokenizer's order of work: added tokens split out first
    (longest match at the leftmost position, as Hugging Face's added vocabulary), each piece
    between them NFC-normalized (if the tokenizer normalizes), then split and merged."""

    def __init__(self, encoding: tiktoken.Encoding, added: dict[str, int], nfc: bool) -> None:
        self.encoding = encoding
        self.added = added
        self.nfc = nfc
        # longest first: a regex alternation takes the first alternative that matches
        alternatives = sorted(added, key=len, reverse=True)
        self._split = (
            re.compile("(" + "|".join(map(re.escape, alternatives)) + ")") if added else None
        )
        self._decoder: _Decoder | None = None  # built on first use
        self._threads = max(1, os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="bpe-twin")

    def encode(self, text: str) -> list[int]:
        parts = self._split.split(text) if self._split else [text]
        ids: list[int] = []
        for index, part in enumerate(parts):
            if index % 2:  # an added token (the split's captured group)
                ids.append(self.added[part])
            elif part:
                if not part.isascii():
                    part.encode("utf-8")  # a lone surrogate raises, as in the tokenizer
                    if self.nfc:
                        part = unicodedata.normalize("NFC", part)
                # tiktoken's core releases the GIL while it splits and merges
                ids += self.encoding.encode_ordinary(part)
        return ids

    def spells(self, ids: npt.NDArray[np.int32], text: str, *, normalized: bool = False) -> bool:
        """`ids` decode to `text`, split at the same added tokens: a lookup, no BPE.
        `normalized`: and every text between the added tokens is NFC (if the tokenizer
        normalizes), as the text of an encoding is."""
        decoder = self._decoder
        if decoder is None:
            decoder = self._decoder = _Decoder(self.encoding, self.added)
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: not a text the tokenizer encodes
            return False
        decoded = decoder.decode(ids)
        if decoded is None or decoded[0] != data:
            return False
        # the same added tokens at the same places: then the texts between them are the same
        parts = self._split.split(text) if self._split else [text]
        if normalized and self.nfc:
            for part in parts[::2]:
                if not (part.isascii() or unicodedata.is_normalized("NFC", part)):
                    return False
        at = np.flatnonzero(decoder.added[ids])
        if 2 * len(at) + 1 != len(parts):
            return False
        starts = decoded[1][at].tolist()
        offset = 0
        for k, position in enumerate(at.tolist()):
            offset += _utf8_len(parts[2 * k])
            if starts[k] != offset or self.added[parts[2 * k + 1]] != ids[position]:
                return False
            offset += _utf8_len(parts[2 * k + 1])
        return True

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        lanes = min(self._threads, len(texts))
        if lanes <= 1:
            return [self.encode(text) for text in texts]
        # interleaved lanes, so long and short texts spread evenly over the threads
        done = list(self._pool.map(self._encode_all, [texts[i::lanes] for i in range(lanes)]))
        out: list[list[int]] = [[] for _ in texts]
        for lane, results in enumerate(done):
            out[lane::lanes] = results
        return out

    def _encode_all(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]


class _Decoder:
    """Ids → bytes as numpy gathers from one buffer of every token's bytes (no Python object a
    token), with each token's start in the output."""

    def __init__(self, encoding: tiktoken.Encoding, added: dict[str, int]) -> None:
        pieces = {rank: token for token, rank in encoding._mergeable_ranks.items()}
        pieces.update({rank: token.encode("utf-8") for token, rank in added.items()})
        size = max(pieces) + 1
        self.lengths = np.full(size, -1, dtype=np.int64)  # -1: no token has this id
        self.starts = np.zeros(size, dtype=np.int64)
        self.added = np.zeros(size, dtype=bool)
        self.added[list(added.values())] = True
        ids = np.fromiter(pieces, dtype=np.int64, count=len(pieces))
        self.lengths[ids] = [len(pieces[i]) for i in ids.tolist()]
        self.starts[ids] = np.cumsum(self.lengths[ids]) - self.lengths[ids]
        self.buffer = np.frombuffer(b"".join(pieces[i] for i in ids.tolist()), dtype=np.uint8)

    def decode(self, ids: npt.NDArray[np.int32]) -> tuple[bytes, npt.NDArray[np.int64]] | None:
        """(the bytes, each token's offset in them), or None if an id is no token's."""
        if len(ids) and (ids.max() >= len(self.lengths) or ids.min() < 0):
            return None
        lengths = self.lengths[ids]
        if len(ids) and lengths.min() < 0:
            return None
        offsets = np.cumsum(lengths) - lengths
        total = int(offsets[-1] + lengths[-1]) if len(ids) else 0
        index = np.arange(total, dtype=np.int64) + np.repeat(self.starts[ids] - offsets, lengths)
        return self.buffer[index].tobytes(), offsets


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


# per tokenizer.json (by digest): the checked twin, or why there is none. Building and checking
# one costs ~3 s on Qwen's 248K vocabulary; every builder of a process shares it.
_TWINS: dict[str, BpeTwin | str] = {}


def _twin_of(tokenizer: Any) -> BpeTwin | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None  # not a Hugging Face fast tokenizer (Kimi's is tiktoken already)
    try:
        spec = backend.to_str()
    except Exception as err:  # a wrapper without Hugging Face's serialization
        log.info("encoding with the tokenizer itself: no tokenizer.json (%s)", err)
        return None
    digest = hashlib.sha256(spec.encode()).hexdigest()
    if digest not in _TWINS:
        started = time.monotonic()
        try:
            _TWINS[digest] = _checked_twin(orjson.loads(spec), TextEncoder(tokenizer, "tokenizer"))
        except Exception as err:  # a tokenizer.json we did not foresee: the tokenizer encodes
            _TWINS[digest] = f"no tiktoken twin ({type(err).__name__}: {err})"
        took = time.monotonic() - started
    else:
        took = 0.0
    twin = _TWINS[digest]
    if isinstance(twin, str):
        log.info("encoding with the tokenizer itself: %s", twin)
        return None
    log.info("%s (built and checked in %.1f s)", TWIN_READY, took)
    return twin


def _checked_twin(spec: dict[str, Any], tokenizer: TextEncoder) -> BpeTwin | str:
    try:
        twin = build_twin(spec)
    except TwinUnsupported as err:
        return f"no tiktoken twin ({err})"
    difference = _difference(twin, tokenizer.reference)
    return f"the tiktoken twin {difference}" if difference else twin


class TwinUnsupported(Exception):
    """The tokenizer is not of the shape tiktoken computes."""


def build_twin(spec: dict[str, Any]) -> BpeTwin:
    """The twin of a tokenizer.json, or TwinUnsupported saying why there is none."""
    normalizer = spec.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        raise TwinUnsupported(f"normalizer {normalizer.get('type')}")
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if [step.get("type") for step in steps] != ["Split", "ByteLevel"]:
        raise TwinUnsupported("not one regex split then byte-level")
    split, byte_level = steps
    pattern = (split.get("pattern") or {}).get("Regex")
    if not pattern or split.get("behavior") != "Isolated" or split.get("invert"):
        raise TwinUnsupported("the split is not an isolated regex split")
    if byte_level.get("add_prefix_space") or byte_level.get("use_regex", True):
        raise TwinUnsupported("the byte-level step adds a space or splits again")
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout") or model.get("byte_fallback"):
        raise TwinUnsupported("the model is not a plain BPE")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise TwinUnsupported("the BPE marks subwords")
    to_byte = unicode_to_byte()
    try:
        ranks = {bytes(to_byte[c] for c in token): rank for token, rank in model["vocab"].items()}
    except KeyError:
        raise TwinUnsupported("the vocabulary is not byte-level") from None
    if len(ranks) != len(model["vocab"]) or any(bytes([b]) not in ranks for b in range(256)):
        raise TwinUnsupported("the vocabulary does not map the 256 bytes one to one")
    _check_merge_order(model)
    added: dict[str, int] = {}
    for token in spec.get("added_tokens") or []:
        if any(token.get(flag) for flag in ("lstrip", "rstrip", "single_word", "normalized")):
            raise TwinUnsupported(f"added token {token.get('content')!r} is not a plain string")
        added[token["content"]] = token["id"]
    encoding = tiktoken.Encoding(
        "draftgen-twin", pat_str=pattern, mergeable_ranks=ranks, special_tokens={}
    )
    return BpeTwin(encoding, added, nfc=normalizer is not None)


def _check_merge_order(model: dict[str, Any]) -> None:
    """Merges listed in the order of their results' ids, each result in the vocabulary."""
    vocab = model["vocab"]
    last = -1
    for merge in model.get("merges") or []:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        rank = vocab.get(left + right)
        if rank is None or rank < last:
            raise TwinUnsupported(f"merge {left!r} + {right!r} is not in the order of the ids")
        last = rank


def _difference(twin: BpeTwin, reference: Callable[[Sequence[str]], list[list[int]]]) -> str | None:
    """Where the twin's ids differ from the tokenizer's: every vocabulary token that is text,
    alone (joined by an added token, which both split out first), and the hard texts."""
    words = []
    for token in twin.encoding.token_byte_values():
        try:
            words.append(token.decode("utf-8"))
        except UnicodeDecodeError:  # a partial character: only ever inside longer text
            continue
    words.sort()
    separator = next(iter(twin.added), None)
    if separator is None:
        texts = words
    else:
        texts = [
            separator.join(words[i : i + CHECK_CHUNK]) for i in range(0, len(words), CHECK_CHUNK)
        ]
    texts += list(HARD_TEXTS)
    for text, ours, theirs in zip(texts, twin.encode_batch(texts), reference(texts), strict=True):
        if ours != theirs:
            at = next(
                (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                min(len(ours), len(theirs)),
            )
            return f"differs from the tokenizer at token {at} of {text[:40]!r}…"
    return None
