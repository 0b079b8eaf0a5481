"""`draftgen report`: samples, tokens, lengths, drops, drift and duplicates of a dataset version,
as JSON, PNG plots and one self-contained HTML page."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from streams.cli.flags import add_flags, build
from streams.core.settings import KafkaSettings, ReportSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, ReportSettings, skip=["kafka"])
    # the broker is optional here and only read: no --partitions
    add_flags(parser, KafkaSettings, only=["bootstrap", "topic_prefix"])
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    settings = build(ReportSettings, args)  # first: a bad setting is said before the imports
    from sinks.reader import DatasetReader
    from sinks.shards import ShardStore
    from streams.tools.report import build_report, collect, load_report_tokenizer, read_kafka_facts
    from streams.tools.report_render import write_report

    options = settings.storage.storage_options()
    reader = DatasetReader(ShardStore(settings.storage.out, settings.dataset, options), options)
    info = reader.info()
    if info is None and not reader.shards():
        raise FileNotFoundError(f"no dataset version {settings.dataset!r} under {reader.store.url}")
    tokenizer_dir = settings.tokenizer_dir or (info or {}).get("tokenizer_dir")
    think_close, note, tokenizer = load_report_tokenizer(tokenizer_dir)
    kafka = (
        asyncio.run(read_kafka_facts(settings.kafka, settings.dataset))
        if settings.kafka is not None
        else None
    )
    totals = collect(reader, think_close)
    report = build_report(
        reader,
        think_close=think_close,
        split_note=note,
        kafka=kafka,
        bins=settings.bins,
        totals=totals,
        tokenizer=tokenizer,
    )
    output = Path(settings.to or f"report-{settings.dataset}")
    written = write_report(report, output, token_counts=totals.token_counts)
    print(
        f"{report['samples']} samples, {report['tokens']} tokens "
        f"(loss {report['loss_fraction']}) in {report['shards']} shards"
    )
    if report["not_recorded"]:
        print("not recorded: " + ", ".join(report["not_recorded"]))
    print(
        f"report: {written['html']} (and {written['json'].name}, the PNG plots and "
        f"{written['token_freq'].name}, the supervised-token counts, beside it)"
    )
    return 0
