"""The formats `draftgen export --format` writes: the one list, `EXPORT_FORMATS`.

A format is a `Writer` (streams/tools/export_writers.py: how its files are opened, named and
finished) in a module of its own or beside the others, registered here once with its help line
and what it needs; `open_writer` makes the one that `export` is given. `--format`'s choices
and help, the command's one-line help, the check on a value from the environment and the docs'
check (tests/streams/cli/test_export.py) all read this list.

This module is cheap to import (the writers' modules, with pyarrow and the shard reader, are
imported when an export is written), so `draftgen export --help` or a bad flag is said at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from streams.core.registry import Registry

if TYPE_CHECKING:
    from streams.tools.export_writers import Writer


@dataclass(frozen=True)
class ExportFormat:
    help: str  # what it writes, for `--format`'s help
    # the writer's class (taking the name and `--to`), imported when an export is written
    writer: Callable[[], Callable[[str, Path], Writer]]
    # each row is joined with the completion behind it, read from the completions topic: the
    # command needs the broker
    needs_completions: bool = False


def _specforge() -> Callable[[str, Path], Writer]:
    from streams.tools.export_writers import SpecforgeWriter

    return SpecforgeWriter


def _hf() -> Callable[[str, Path], Writer]:
    from streams.tools.export_writers import HfWriter

    return HfWriter


def _parquet() -> Callable[[str, Path], Writer]:
    from streams.tools.export_writers import ParquetWriter

    return ParquetWriter


def _conversations() -> Callable[[str, Path], Writer]:
    from streams.tools.conversations import ConversationsWriter

    return ConversationsWriter


EXPORT_FORMATS: Registry[ExportFormat] = Registry(
    "export format",
    [
        (
            "specforge",
            ExportFormat("JSON lines of prompt_id, input_ids, loss_mask, provenance", _specforge),
        ),
        ("hf", ExportFormat("a datasets save_to_disk directory", _hf)),
        ("parquet", ExportFormat("one Parquet file", _parquet)),
        (
            "conversations",
            ExportFormat(
                "each sample's regenerated conversation (OpenAI messages) from the completions "
                "topic, JSON lines (Parquet when --to ends in .parquet)",
                _conversations,
                needs_completions=True,
            ),
        ),
    ],
)


def open_writer(name: str, output: Path) -> Writer:
    """The writer of the format registered as `name`, for `output` (imports its module)."""
    return EXPORT_FORMATS.named(name).writer()(name, output)
