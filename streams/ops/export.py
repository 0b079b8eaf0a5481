"""`draftgen export`: a dataset version as the file a trainer takes.

- `specforge`: JSON lines `{"prompt_id", "input_ids", "loss_mask"}`. SpecForge reads a JSONL
  whose first record has both `input_ids` and `loss_mask` as pre-tokenized
  (specforge/data/prompt_builder.py): it cuts each row to its `data.max_length` (keeping the
  head) and then skips rows with fewer supervised tokens than the strategy's minimum (2 for
  DFlash / DSpark / Domino, which also need two adjacent supervised tokens; 1 for EAGLE-3).
  The export applies the same two rules itself, `--max-seq-len` then `--min-loss-run`, so the
  file holds exactly the rows SpecForge will train on and the drops are counted here.
- `hf`: a `datasets` `save_to_disk` directory; `parquet`: one Parquet file. Both keep every
  shard column (token lists cut to `--max-seq-len`, counts recomputed) plus `truncated`.

Filters (`--source`, `--finish-reason`, `--min-len`/`--max-len` on the stored length) are
applied before the length rules. Everything is vectorized per shard, and memory is one shard.
The output is written beside its final name and renamed into place when complete.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sinks.reader import DatasetReader, table_rows
from sinks.shards import SHARD_SCHEMA

Format = Literal["specforge", "hf", "parquet"]
EXPORT_SCHEMA = SHARD_SCHEMA.append(pa.field("truncated", pa.bool_()))
SPECFORGE_COLUMNS = ("prompt_id", "input_ids", "loss_mask")


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

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "dropped": dict(self.dropped)}

    def lines(self) -> list[str]:
        drops = ", ".join(f"{rule} {n}" for rule, n in sorted(self.dropped.items())) or "none"
        return [
            f"exported {self.written} of {self.read} samples to {self.output} ({self.format})",
            f"  tokens {self.tokens}, loss tokens {self.loss_tokens}, truncated {self.truncated}",
            f"  dropped: {drops}",
        ]


# -- the rules, vectorized over one shard ----------------------------------------------------


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
    summary.written += table.num_rows
    summary.truncated += int(pc.sum(table["truncated"]).as_py() or 0)
    summary.tokens += int(pc.sum(table["num_tokens"]).as_py() or 0)
    summary.loss_tokens += int(pc.sum(table["num_loss_tokens"]).as_py() or 0)
    return table


# -- writers ---------------------------------------------------------------------------------


@contextmanager
def _in_place(output: Path) -> Iterator[Path]:
    """A temporary path beside `output`, renamed to it when the block succeeds."""
    if output.exists():
        raise FileExistsError(f"{output} exists; remove it or choose another --output")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        yield tmp / output.name
        os.replace(tmp / output.name, output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_jsonl(tables: Iterator[pa.Table], path: Path) -> None:
    option = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
    with path.open("wb") as handle:
        for table in tables:
            for row in table_rows(table.select(list(SPECFORGE_COLUMNS))):
                handle.write(orjson.dumps(row, option=option))


def _write_parquet(tables: Iterator[pa.Table], path: Path) -> None:
    with pq.ParquetWriter(path, EXPORT_SCHEMA) as writer:
        for table in tables:
            writer.write_table(table.cast(EXPORT_SCHEMA))


def _write_hf(tables: Iterator[pa.Table], path: Path) -> None:
    import datasets

    work = path.parent / "work"
    work.mkdir()
    parquet = work / "rows.parquet"
    _write_parquet(tables, parquet)
    loaded = datasets.Dataset.from_parquet(str(parquet), cache_dir=str(work / "cache"))
    assert isinstance(loaded, datasets.Dataset)
    loaded.save_to_disk(str(path))


WRITERS: dict[str, Callable[[Iterator[pa.Table], Path], None]] = {
    "specforge": _write_jsonl,
    "parquet": _write_parquet,
    "hf": _write_hf,
}


def export(reader: DatasetReader, fmt: Format, output: Path, rules: ExportRules) -> ExportSummary:
    summary = ExportSummary(format=fmt, output=str(output))
    tables = (apply_rules(table, rules, summary) for table in reader.tables())
    with _in_place(output) as tmp:
        WRITERS[fmt](tables, tmp)
    return summary


__all__ = [
    "EXPORT_SCHEMA",
    "SPECFORGE_COLUMNS",
    "ExportRules",
    "ExportSummary",
    "apply_rules",
    "export",
    "has_loss_run",
    "truncate",
]
