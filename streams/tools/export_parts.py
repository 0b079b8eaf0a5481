"""The export's output files: a `Part` (one file being written, one table at a time), the
parts the formats share, and `SplitFiles`, which cuts the output into numbered parts."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import final

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sinks.reader import table_rows
from streams.tools.export_rules import ExportSummary

SPECFORGE_COLUMNS = ("prompt_id", "input_ids", "loss_mask")


class Part(ABC):
    """One output file being written. What `export` requires of it, enforced here once:

    - `write(table)` gets the rule-applied rows of (part of) one shard and has them in the file
      when it returns: written and flushed to the OS, nothing held for later. `export` reads
      the next shard only then, so memory stays one shard and the output grows shard by shard.
      `write` is `_write` then `_flush`; a part that buffers says in `_flush` how to empty it.
    - `close()` completes the file (a footer, an end of stream) and releases it. It comes once,
      after any number of writes, none included: a part closed unwritten is still a valid
      (empty) file, since an empty export is one. Nothing is written after it.
    - No fsync: the output is renamed into place only once every part is closed and the writer
      has finished (`export`), so a crash leaves no partial output under the final name.
    """

    _closed = False

    @final
    def write(self, table: pa.Table) -> None:
        if self._closed:
            raise ValueError("write to a closed export part")
        self._write(table)
        self._flush()

    @final
    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()

    @abstractmethod
    def _write(self, table: pa.Table) -> None: ...

    @abstractmethod
    def _flush(self) -> None:
        """Hand what `_write` buffered to the OS (nothing, for a writer that writes through)."""

    @abstractmethod
    def _close(self) -> None: ...


class JsonlPart(Part):
    """SpecForge's pre-tokenized rows, or (a `json` column) rows already encoded."""

    OPTION = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE

    def __init__(self, path: Path):
        self.handle = path.open("wb")

    def _write(self, table: pa.Table) -> None:
        if "json" in table.column_names:
            for encoded in table["json"].to_pylist():
                self.handle.write(encoded + b"\n")
            return
        # SpecForge reads the three columns and ignores the others; provenance stays JSON
        # text, as in the shards: one type in every row for loaders that infer a schema
        for row in table_rows(table.select([*SPECFORGE_COLUMNS, "provenance"])):
            self.handle.write(orjson.dumps(row, option=self.OPTION))

    def _flush(self) -> None:
        self.handle.flush()  # a buffered file: its tail would wait for the next shard

    def _close(self) -> None:
        self.handle.close()


class ParquetPart(Part):
    def __init__(self, path: Path, schema: pa.Schema, convert: Callable[[pa.Table], pa.Table]):
        self.writer = pq.ParquetWriter(path, schema)
        self.schema = schema
        self.convert = convert

    def _write(self, table: pa.Table) -> None:
        self.writer.write_table(self.convert(table))

    def _flush(self) -> None:
        pass  # `write_table` has written its row groups to the file when it returns

    def _close(self) -> None:
        self.writer.close()


class ArrowPart(Part):
    """An Arrow IPC stream file, as `datasets.save_to_disk` writes its data files."""

    def __init__(self, path: Path, schema: pa.Schema):
        self.sink = pa.OSFile(str(path), "wb")
        self.writer = pa.ipc.new_stream(self.sink, schema)
        self.schema = schema

    def _write(self, table: pa.Table) -> None:
        self.writer.write_table(table.cast(self.schema))

    def _flush(self) -> None:
        pass  # an `OSFile` is unbuffered: each batch is in the file once written

    def _close(self) -> None:
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
