"""The export's row rules, vectorized over one shard: the filters, SpecForge's cut
(`--max-seq-len`) and its supervised-run filter (`--min-loss-run`), and the summary that counts
what they kept and dropped."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class ExportRules:
    sources: frozenset[str] = frozenset()  # empty: every source
    finish_reasons: frozenset[str] = frozenset()
    min_len: int | None = None  # on the stored length, before any truncation
    max_len: int | None = None
    max_seq_len: int | None = None
    over_max_seq_len: Literal["truncate", "drop"] = "truncate"
    min_loss_run: int = 2


@dataclass
class ExportSummary:
    format: str
    output: str
    read: int = 0
    written: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    truncated: int = 0
    dropped: Counter[str] = field(default_factory=Counter)  # by rule
    files: list[list[Any]] = field(default_factory=list)  # [name, rows, tokens] per file

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "dropped": dict(self.dropped)}

    def lines(self) -> list[str]:
        drops = ", ".join(f"{rule} {n}" for rule, n in sorted(self.dropped.items())) or "none"
        return [
            f"exported {self.written} of {self.read} samples to {self.output} ({self.format})",
            f"  tokens {self.tokens}, loss tokens {self.loss_tokens}, truncated {self.truncated}",
            f"  dropped: {drops}",
            *(
                [
                    f"  {len(self.files)} files, at most {max(f[1] for f in self.files)} rows and "
                    f"{max(f[2] for f in self.files)} tokens a file"
                ]
                if len(self.files) > 1
                else []
            ),
        ]


def _list_parts(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(flat values, offsets from 0) of a list column."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = array.offsets.to_numpy()
    return array.flatten().to_numpy(), offsets - offsets[0]


def _list_array(flat: np.ndarray, offsets: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), pa.array(flat, type=arrow_type)
    )


def truncate(table: pa.Table, max_seq_len: int) -> tuple[pa.Table, np.ndarray]:
    """Keep the first `max_seq_len` tokens of each row (SpecForge's cut); (table, which rows
    were cut)."""
    ids, offsets = _list_parts(table.column("input_ids"))
    mask, _ = _list_parts(table.column("loss_mask"))
    lengths = np.diff(offsets)
    cut = lengths > max_seq_len
    if not cut.any():
        return table, cut
    new_lengths = np.minimum(lengths, max_seq_len)
    position = np.arange(len(ids)) - np.repeat(offsets[:-1], lengths)
    keep = position < max_seq_len
    new_offsets = np.concatenate([[0], np.cumsum(new_lengths)])
    kept_mask = mask[keep]
    prefix = np.concatenate([[0], np.cumsum(kept_mask, dtype=np.int64)])
    loss = prefix[new_offsets[1:]] - prefix[new_offsets[:-1]]
    columns = {
        "input_ids": _list_array(ids[keep], new_offsets, pa.int32()),
        "loss_mask": _list_array(kept_mask, new_offsets, pa.int8()),
        "num_tokens": pa.array(new_lengths.astype(np.int32)),
        "num_loss_tokens": pa.array(np.asarray(loss, dtype=np.int32)),
    }
    for name, array in columns.items():
        table = table.set_column(table.schema.get_field_index(name), name, array)
    return table, cut


def has_loss_run(table: pa.Table, run: int) -> np.ndarray:
    """Per row: some `run` consecutive supervised tokens (SpecForge's DFlash filter for 2)."""
    mask, offsets = _list_parts(table.column("loss_mask"))
    rows = table.num_rows
    if run <= 0 or rows == 0:
        return np.ones(rows, dtype=bool)
    if len(mask) < run:
        return np.zeros(rows, dtype=bool)
    prefix = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
    starts = np.arange(len(mask) - run + 1)
    full = prefix[starts + run] - prefix[starts] == run
    row_of = np.searchsorted(offsets, starts, side="right") - 1
    inside = row_of == np.searchsorted(offsets, starts + run - 1, side="right") - 1
    found = np.zeros(rows, dtype=bool)
    found[row_of[full & inside]] = True
    return found


def apply_rules(table: pa.Table, rules: ExportRules, summary: ExportSummary) -> pa.Table:
    """The rows to export from one shard, cut and counted."""
    summary.read += table.num_rows

    def keep(condition: pa.Array | np.ndarray, rule: str) -> None:
        nonlocal table
        array = pa.array(condition) if isinstance(condition, np.ndarray) else condition
        array = pc.fill_null(array, False)
        summary.dropped[rule] += table.num_rows - pc.sum(array).as_py() if table.num_rows else 0
        table = table.filter(array)

    if rules.sources:
        keep(pc.is_in(table["source"], pa.array(sorted(rules.sources))), "source")
    if rules.finish_reasons:
        keep(pc.is_in(table["finish_reason"], pa.array(sorted(rules.finish_reasons))), "finish")
    if rules.min_len is not None:
        keep(pc.greater_equal(table["num_tokens"], rules.min_len), "length")
    if rules.max_len is not None:
        keep(pc.less_equal(table["num_tokens"], rules.max_len), "length")
    if rules.max_seq_len is not None and rules.over_max_seq_len == "drop":
        keep(pc.less_equal(table["num_tokens"], rules.max_seq_len), "max_seq_len")
    cut = np.zeros(table.num_rows, dtype=bool)
    if rules.max_seq_len is not None and rules.over_max_seq_len == "truncate":
        table, cut = truncate(table, rules.max_seq_len)
    table = table.append_column("truncated", pa.array(cut))
    keep(has_loss_run(table, rules.min_loss_run), "min_loss_run")
    summary.dropped = +summary.dropped  # rules that dropped nothing are not listed
    return table
