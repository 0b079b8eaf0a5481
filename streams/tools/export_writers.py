"""The export formats' writers: `Writer` (how a format opens, names and finishes its files)
and the token formats' own, `specforge`, `parquet` and `hf`."""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from sinks.shards import SHARD_SCHEMA
from streams.tools.export_parts import ArrowPart, JsonlPart, ParquetPart, Part
from streams.tools.export_rules import ExportSummary

EXPORT_SCHEMA = SHARD_SCHEMA.append(pa.field("truncated", pa.bool_()))


class Writer(ABC):
    """How an export format writes `--to`: one file, or (split) a directory of numbered
    parts; a `directory` format writes a directory of data files however it is split. Each
    part is a `Part` opened by `open_part` (what a part must do on write and close is that
    class's rule); `finish` completes the output once every part is closed. Registered under
    `name` in streams/tools/export_formats.py (`open_writer`)."""

    suffix = ".jsonl"
    directory = False

    def __init__(self, name: str, output: Path):
        self.name = name
        self.output = output

    @abstractmethod
    def open_part(self, path: Path) -> Part: ...

    def part_name(self, index: int) -> str:
        return f"part-{index:05d}{self.suffix}"

    def finish(self, written: Path, summary: ExportSummary) -> None:
        """After the last part, on the output as written (beside its final name)."""
        return  # a format whose parts are the whole output: nothing to add


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
