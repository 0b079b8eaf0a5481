"""`draftgen export`: a dataset version in one of the registered export formats
(streams/tools/export_formats.py: SpecForge JSONL, a `datasets` directory, Parquet, the
regenerated conversations from the completions topic, …), in one file or split."""

from __future__ import annotations

import argparse
from pathlib import Path

from streams.cli.flags import add_flags, build
from streams.core.errors import CliError
from streams.core.settings import ExportSettings, KafkaSettings
from streams.tools.export_formats import EXPORT_FORMATS

# `--format` names a registered format; the settings sit below the registry and cannot
REGISTRIES = {"format": EXPORT_FORMATS}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, ExportSettings, skip=["kafka"], registries=REGISTRIES)
    # the broker, for --format conversations only, and only read: no --partitions
    add_flags(parser, KafkaSettings, only=["bootstrap", "topic_prefix"])
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # first: a bad setting is said before the imports
    settings = build(ExportSettings, args, registries=REGISTRIES)
    declared = EXPORT_FORMATS[settings.format]
    from sinks.reader import DatasetReader
    from sinks.shards import ShardStore
    from streams.tools.conversations import CompletionsJoin
    from streams.tools.export import ExportRules, FileSplit, export
    from streams.tools.export_formats import open_writer

    if Path(settings.to).exists():
        raise CliError(f"--to {settings.to} exists; remove it or choose another")
    if declared.needs_completions and settings.kafka is None:
        raise CliError(
            f"--format {settings.format} reads the completions topic: give --bootstrap (or set "
            "DRAFTGEN_BOOTSTRAP)"
        )
    options = settings.storage.storage_options()
    reader = DatasetReader(ShardStore(settings.storage.out, settings.dataset, options), options)
    if reader.info() is None and not reader.shards():
        raise FileNotFoundError(f"no dataset version {settings.dataset!r} under {reader.store.url}")
    rules = ExportRules(
        sources=frozenset(settings.sources),
        finish_reasons=frozenset(settings.finish_reasons),
        min_len=settings.min_len,
        max_len=settings.max_len,
        max_seq_len=settings.cut.max_seq_len,
        over_max_seq_len=settings.cut.on_max_seq_len,
        min_loss_run=settings.cut.min_loss_run,
    )
    split = FileSplit(rows=settings.rows_per_file, tokens=settings.tokens_per_file)
    join = None
    if declared.needs_completions and settings.kafka is not None:
        join = CompletionsJoin(settings.kafka)
    try:
        writer = open_writer(settings.format, Path(settings.to))
        summary = export(reader, writer, rules, split, join)
    finally:
        if join is not None:
            join.close()
    print("\n".join(summary.lines()))
    return 0
