"""`draftgen export`: a dataset version as SpecForge JSONL, a `datasets` directory or Parquet."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from streams.cli.flags import add_flags, build
from streams.core.errors import CliError
from streams.core.settings import ExportSettings


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "export", help="a dataset version as a trainer's input (specforge, hf, parquet)"
    )
    add_flags(parser, ExportSettings)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sinks.reader import DatasetReader
    from sinks.shards import ShardStore
    from streams.ops.export import ExportRules, export

    settings = build(ExportSettings, args)
    if Path(settings.output).exists():
        raise CliError(f"--output {settings.output} exists; remove it or choose another")
    options = settings.storage.storage_options()
    reader = DatasetReader(ShardStore(settings.storage.out, settings.dataset, options), options)
    if reader.info() is None and not reader.shards():
        raise FileNotFoundError(f"no dataset version {settings.dataset!r} under {reader.store.url}")
    rules = ExportRules(
        sources=frozenset(settings.sources),
        finish_reasons=frozenset(settings.finish_reasons),
        min_len=settings.min_len,
        max_len=settings.max_len,
        max_seq_len=settings.max_seq_len,
        over_max_seq_len=settings.over_max_seq_len,
        min_loss_run=settings.min_loss_run,
    )
    summary = export(reader, settings.format, Path(settings.output), rules)
    print("\n".join(summary.lines()))
    return 0
