"""`draftgen export`: a dataset version as the file a trainer takes.

- `specforge`: JSON lines `{"prompt_id", "input_ids", "loss_mask"}`. SpecForge reads a JSONL
  whose first record has both `input_ids` and `loss_mask` as pre-tokenized
  (specforge/data/prompt_builder.py): it cuts each row to its `data.max_length` (keeping the
  head) and then skips rows with fewer supervised tokens than the strategy's minimum (2 for
  DFlash / DSpark / Domino, which also need two adjacent supervised tokens; 1 for EAGLE-3).
  The export applies the same two rules itself, `--max-seq-len` then `--min-loss-run`, so the
  file holds exactly the rows SpecForge will train on and the drops are counted here.
- `hf`: a `datasets` `save_to_disk` directory (its Arrow data files written here, shard by
  shard, and opened memory-mapped by `load_from_disk`); `parquet`: one Parquet file. Both keep
  every shard column (token lists cut to `--max-seq-len`, counts recomputed) plus `truncated`.
- `conversations`: the completion behind each exported row, as OpenAI messages
  (streams/tools/conversations.py); JSON lines, or Parquet for an `--to` ending in
  `.parquet`. The rules choose the rows as for the token formats; the conversation is whole.

Each format is a `Writer` registered in streams/tools/export_formats.py, the one list of them.

Filters (`--source`, `--finish-reason`, `--min-len`/`--max-len` on the stored length) are
applied before the length rules. `--rows-per-file` / `--tokens-per-file` split the output into
numbered files (`--to` is then a directory of `part-NNNNN.*`; for `hf`, the data files of
the one `save_to_disk` directory). Everything is vectorized per shard and written before the
next shard is read: memory is one shard (plus, for `conversations`, its window's completions
of the exported rows), whatever the version's size. The output is written beside its final
name and renamed into place when complete.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sinks.reader import DatasetReader, ShardRef, table_rows
from sinks.shards import SHARD_SCHEMA

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
    return table


# -- files -----------------------------------------------------------------------------------


class Part(Protocol):
    """One output file being written."""

    def write(self, table: pa.Table) -> None: ...

    def close(self) -> None: ...


class JsonlPart:
    """SpecForge's pre-tokenized rows, or (a `json` column) rows already encoded."""

    OPTION = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE

    def __init__(self, path: Path):
        self.handle = path.open("wb")

    def write(self, table: pa.Table) -> None:
        if "json" in table.column_names:
            for encoded in table["json"].to_pylist():
                self.handle.write(encoded + b"\n")
            return
        # SpecForge reads the three columns and ignores the others; provenance stays JSON
        # text, as in the shards: one type in every row for loaders that infer a schema
        for row in table_rows(table.select([*SPECFORGE_COLUMNS, "provenance"])):
            self.handle.write(orjson.dumps(row, option=self.OPTION))

    def close(self) -> None:
        self.handle.close()


class ParquetPart:
    def __init__(self, path: Path, schema: pa.Schema, convert: Callable[[pa.Table], pa.Table]):
        self.writer = pq.ParquetWriter(path, schema)
        self.schema = schema
        self.convert = convert

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(self.convert(table))

    def close(self) -> None:
        self.writer.close()


class ArrowPart:
    """An Arrow IPC stream file, as `datasets.save_to_disk` writes its data files."""

    def __init__(self, path: Path, schema: pa.Schema):
        self.sink = pa.OSFile(str(path), "wb")
        self.writer = pa.ipc.new_stream(self.sink, schema)
        self.schema = schema

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(table.cast(self.schema))

    def close(self) -> None:
        self.writer.close()
        self.sink.close()


@dataclass(frozen=True)
class FileSplit:
    """Where a file ends: at `rows` rows or `tokens` tokens (None: no limit)."""

    rows: int | None = None
    tokens: int | None = None

    @property
    def active(self) -> bool:
        return self.rows is not None or self.tokens is not None


class SplitFiles:
    """Tables written to one file, or to numbered parts that each hold at most `split.rows`
    rows and `split.tokens` tokens (a row longer than that gets a part of its own). What is
    written is counted in `summary`; nothing but the open part's writer is held."""

    def __init__(
        self,
        target: Path,
        open_part: Callable[[Path], Part],
        split: FileSplit,
        summary: ExportSummary,
        name: Callable[[int], str],
    ):
        self.target = target
        self.open_part = open_part
        self.split = split
        self.summary = summary
        self.name = name
        self.part: Part | None = None
        self.rows = 0
        self.tokens = 0

    def _open(self) -> Part:
        if self.part is None:
            path = self.target / self.name(len(self.summary.files))
            self.part = self.open_part(path)
            self.summary.files.append([path.name, 0, 0])
        return self.part

    def _close(self) -> None:
        if self.part is not None:
            self.part.close()
            self.part, self.rows, self.tokens = None, 0, 0

    def write(self, table: pa.Table) -> None:
        tokens = table["num_tokens"].to_numpy().astype(np.int64)
        at = 0
        while at < table.num_rows:
            take = table.num_rows - at
            if self.split.rows is not None:
                take = min(take, self.split.rows - self.rows)
            if self.split.tokens is not None:
                room = self.split.tokens - self.tokens
                fits = int(np.searchsorted(np.cumsum(tokens[at : at + take]), room, "right"))
                take = min(take, fits)
            if take <= 0:
                if self.rows:
                    self._close()  # full: the next part takes the row
                    continue
                take = 1  # longer than a whole part: a part of its own
            piece = table.slice(at, take)
            self._open().write(piece)
            count = int(tokens[at : at + take].sum())
            self.rows += take
            self.tokens += count
            self.summary.files[-1][1] += take
            self.summary.files[-1][2] += count
            _count_written(piece, self.summary)
            at += take
            if self.split.rows is not None and self.rows >= self.split.rows:
                self._close()

    def close(self) -> None:
        if not self.summary.files:
            self._open()  # an empty export is still a (one) file
        self._close()


def _count_written(table: pa.Table, summary: ExportSummary) -> None:
    summary.written += table.num_rows
    summary.truncated += int(pc.sum(table["truncated"]).as_py() or 0)
    summary.tokens += int(pc.sum(table["num_tokens"]).as_py() or 0)
    summary.loss_tokens += int(pc.sum(table["num_loss_tokens"]).as_py() or 0)


@contextmanager
def _in_place(output: Path) -> Iterator[Path]:
    """A temporary directory beside `output`, whose entry named like it is renamed to it when
    the block succeeds."""
    if output.exists():
        raise FileExistsError(f"{output} exists; remove it or choose another --to")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        yield tmp / output.name
        os.replace(tmp / output.name, output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _finish_hf(directory: Path, schema: pa.Schema) -> None:
    """Name the data files as `save_to_disk` does and write its `state.json` and
    `dataset_info.json`, so `datasets.load_from_disk` opens the directory (memory-mapped)."""
    import datasets

    files = sorted(directory.glob("data-*.arrow"))
    names = [f"data-{i:05d}-of-{len(files):05d}.arrow" for i in range(len(files))]
    for path, name in zip(files, names, strict=True):
        path.rename(directory / name)
    state: dict[str, Any] = {
        "_data_files": [{"filename": name} for name in names],
        "_fingerprint": secrets.token_hex(8),
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    (directory / "state.json").write_bytes(orjson.dumps(state, option=orjson.OPT_INDENT_2))
    features = datasets.Features.from_arrow_schema(schema)
    datasets.DatasetInfo(features=features).write_to_directory(str(directory))


class Writer:
    """How an export format writes `--to`: one file, or (split) a directory of numbered
    parts; a `directory` format writes a directory of data files however it is split. Each
    part is opened by `open_part`; `finish` completes the output once every part is written.
    Registered under `name` in streams/tools/export_formats.py (`open_writer`)."""

    suffix = ".jsonl"
    directory = False

    def __init__(self, name: str, output: Path):
        self.name = name
        self.output = output

    def open_part(self, path: Path) -> Part:
        raise NotImplementedError

    def part_name(self, index: int) -> str:
        return f"part-{index:05d}{self.suffix}"

    def finish(self, written: Path, summary: ExportSummary) -> None:
        """After the last part, on the output as written (beside its final name)."""


class SpecforgeWriter(Writer):
    def open_part(self, path: Path) -> Part:
        return JsonlPart(path)


class ParquetWriter(Writer):
    suffix = ".parquet"

    def open_part(self, path: Path) -> Part:
        return ParquetPart(path, EXPORT_SCHEMA, _export_columns)


class HfWriter(Writer):
    """The data files of a `save_to_disk` directory, then its index files."""

    suffix = ".arrow"
    directory = True

    def open_part(self, path: Path) -> Part:
        return ArrowPart(path, EXPORT_SCHEMA)

    def part_name(self, index: int) -> str:
        return f"data-{index:05d}.arrow"

    def finish(self, written: Path, summary: ExportSummary) -> None:
        _finish_hf(written, EXPORT_SCHEMA)
        for index, entry in enumerate(summary.files):
            entry[0] = f"data-{index:05d}-of-{len(summary.files):05d}.arrow"


def _export_columns(table: pa.Table) -> pa.Table:
    return table.cast(EXPORT_SCHEMA)


Completions = Callable[[ShardRef, pa.Table, ExportSummary], pa.Table]


def export(
    reader: DatasetReader,
    writer: Writer,
    rules: ExportRules,
    split: FileSplit = FileSplit(),
    conversations: Completions | None = None,
) -> ExportSummary:
    """Shard by shard: read, filter and cut, (for a format that needs them, join with the
    completions that became the rows: `conversations`), write to `writer.output`. Memory is one
    shard and the writer of one output file."""
    summary = ExportSummary(format=writer.name, output=str(writer.output))
    with _in_place(writer.output) as tmp:
        if writer.directory or split.active:
            tmp.mkdir()
            files = SplitFiles(tmp, writer.open_part, split, summary, writer.part_name)
        else:
            files = SplitFiles(tmp.parent, writer.open_part, split, summary, lambda i: tmp.name)
        for ref in reader.shards():
            table = apply_rules(reader.read_shard(ref), rules, summary)
            if conversations is not None and table.num_rows:
                table = conversations(ref, table, summary)
            files.write(table)
        files.close()
        writer.finish(tmp, summary)
    return summary


__all__ = [
    "EXPORT_SCHEMA",
    "SPECFORGE_COLUMNS",
    "ExportRules",
    "ExportSummary",
    "FileSplit",
    "JsonlPart",
    "ParquetPart",
    "Part",
    "Writer",
    "apply_rules",
    "export",
    "has_loss_run",
    "truncate",
]
