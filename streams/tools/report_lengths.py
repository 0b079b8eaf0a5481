"""The report's token lengths (prompt, reasoning, answer, total), their distributions, and the
tokenizer that splits reasoning from answer (streams/tools/report.py explains each length)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from streams.core.families import detect_family

LENGTHS = ("prompt", "reasoning", "answer", "total")


# -- lengths ---------------------------------------------------------------------------------


def _first_per_row(positions: np.ndarray, offsets: np.ndarray, rows: int) -> np.ndarray:
    """Index of the first of `positions` (sorted flat indices) in each row; -1 where none."""
    first = np.full(rows, -1, dtype=np.int64)
    if len(positions):
        row_of = np.searchsorted(offsets, positions, side="right") - 1
        unique_rows, index = np.unique(row_of, return_index=True)
        first[unique_rows] = positions[index]
    return first


def sample_lengths(table: pa.Table, think_close: int | None) -> dict[str, np.ndarray]:
    """Per sample: prompt, generated, total, reasoning and answer lengths (the last two -1
    where the sample has no supervised `think_close` or no token id is known)."""
    rows = table.num_rows
    ids_column = table.column("input_ids").combine_chunks()
    mask_column = table.column("loss_mask").combine_chunks()
    raw_offsets = mask_column.offsets.to_numpy().astype(np.int64)
    offsets = raw_offsets - raw_offsets[0]
    mask = mask_column.flatten().to_numpy()
    ids = ids_column.flatten().to_numpy()
    lengths = np.diff(offsets)
    prefix = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
    generated = prefix[offsets[1:]] - prefix[offsets[:-1]]
    first_loss = _first_per_row(np.flatnonzero(mask), offsets, rows)
    prompt = np.where(first_loss >= 0, first_loss - offsets[:-1], lengths)
    reasoning = np.full(rows, -1, dtype=np.int64)
    if think_close is not None:
        close = _first_per_row(np.flatnonzero((ids == think_close) & (mask == 1)), offsets, rows)
        split = close >= 0
        reasoning[split] = prefix[close[split] + 1] - prefix[offsets[:-1][split]]
    answer = np.where(reasoning >= 0, generated - reasoning, -1)
    return {
        "prompt": prompt,
        "generated": generated,
        "total": lengths,
        "reasoning": reasoning,
        "answer": answer,
    }


def distribution(values: np.ndarray, bins: int) -> dict[str, Any]:
    """Summary figures and a histogram (bin edges and counts) of non-negative lengths."""
    if len(values) == 0:
        return {"count": 0}
    top = int(values.max())
    counts, edges = np.histogram(values, bins=bins, range=(0, max(top, 1)))
    return {
        "count": len(values),
        "min": int(values.min()),
        "max": top,
        "mean": round(float(values.mean()), 2),
        "p50": float(np.percentile(values, 50)),
        "p90": float(np.percentile(values, 90)),
        "p99": float(np.percentile(values, 99)),
        "histogram": {"edges": [round(float(e), 2) for e in edges], "counts": counts.tolist()},
    }


@dataclass
class LengthCounts:
    """How many samples have each length, per figure: the lengths' distribution in memory
    that grows with the longest sample, not with the number of samples. Negative lengths
    (reasoning and answer of a sample that was not split) are counted apart."""

    counts: dict[str, np.ndarray] = field(default_factory=dict)
    unsplit: int = 0

    def add(self, lengths: dict[str, np.ndarray]) -> None:
        for name, values in lengths.items():
            known = values[values >= 0]
            if name == "reasoning":
                self.unsplit += len(values) - len(known)
            counts = np.bincount(known, minlength=len(self.counts.get(name, ())))
            if name in self.counts:
                counts[: len(self.counts[name])] += self.counts[name]
            self.counts[name] = counts

    def distribution(self, name: str, bins: int) -> dict[str, Any]:
        return distribution_of_counts(self.counts.get(name, np.zeros(0, np.int64)), bins)


def distribution_of_counts(counts: np.ndarray, bins: int) -> dict[str, Any]:
    """`distribution` of the lengths whose counts are `counts` (counts[n]: samples of length
    n), figure for figure (numpy's linear percentiles)."""
    total = int(counts.sum())
    if total == 0:
        return {"count": 0}
    present = np.flatnonzero(counts)
    low, top = int(present[0]), int(present[-1])
    lengths = np.arange(len(counts))
    histogram, edges = np.histogram(lengths, bins=bins, range=(0, max(top, 1)), weights=counts)
    cumulative = np.cumsum(counts)

    def nth(k: int) -> int:  # the k-th smallest length, from 0
        return int(np.searchsorted(cumulative, k, side="right"))

    def percentile(q: float) -> float:  # numpy's "linear" method, to the last bit
        at = (total - 1) * (q / 100)
        below = int(np.floor(at))
        lower, upper = nth(below), nth(min(below + 1, total - 1))
        gamma, diff = at - below, float(upper - lower)
        return float(upper - diff * (1 - gamma) if gamma >= 0.5 else lower + diff * gamma)

    return {
        "count": total,
        "min": low,
        "max": top,
        "mean": round(float((lengths * counts).sum() / total), 2),
        "p50": percentile(50),
        "p90": percentile(90),
        "p99": percentile(99),
        "histogram": {
            "edges": [round(float(e), 2) for e in edges],
            "counts": histogram.astype(np.int64).tolist(),
        },
    }


def think_close_id(tokenizer_dir: str | None) -> tuple[int | None, str]:
    """The token id that closes thinking in this tokenizer, or None and why not."""
    token_id, note, _ = load_report_tokenizer(tokenizer_dir)
    return token_id, note


def load_report_tokenizer(tokenizer_dir: str | None) -> tuple[int | None, str, Any]:
    """(the id that closes thinking or None, why, the tokenizer or None): the tokenizer also
    names the most frequent supervised tokens."""
    if not tokenizer_dir:
        return None, "no tokenizer directory recorded in dataset.json (give --tokenizer-dir)", None
    path = Path(tokenizer_dir)
    if not path.is_dir():
        note = f"tokenizer directory {path} is not on this machine (give --tokenizer-dir)"
        return None, note, None
    try:
        from transformers import AutoTokenizer

        logging.getLogger("transformers").setLevel(logging.ERROR)
        token = detect_family(path).think_close
        tokenizer = AutoTokenizer.from_pretrained(
            str(path), trust_remote_code=True, local_files_only=True
        )
        token_id = tokenizer.convert_tokens_to_ids(token)
    except Exception as err:
        reason = str(err).splitlines()[0][:200]
        return None, f"cannot load the tokenizer in {path}: {reason}", None
    if not isinstance(token_id, int) or tokenizer.convert_ids_to_tokens(token_id) != token:
        return None, f"{token} is not a single token of the tokenizer in {path}", tokenizer
    return token_id, f"{token} = id {token_id} ({path})", tokenizer
