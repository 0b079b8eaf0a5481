"""`draftgen audit`: every published prompt without an outcome (no completion, dead letter or
ledger mark; under a version's generation settings with --out/--dataset, which also checks that
every completion its tokenize group committed is in it), what the prompts topic's retention
deleted, and the one command that republishes them; exit status 1 if any."""

from __future__ import annotations

import argparse
import asyncio
import sys

from streams.cli.flags import add_flags, build
from streams.core.settings import AuditSettings, KafkaSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, AuditSettings)
    add_flags(parser, KafkaSettings)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    chosen = build(AuditSettings, args)  # first: a bad setting is said before the imports
    kafka = build(KafkaSettings, args)
    import orjson

    from sinks.shards import ShardStore
    from streams.cli.run import draftgen_command
    from streams.core.errors import CliError
    from streams.tools.audit import audit, republish_command

    store, version = None, tuple[str, ...]()
    if chosen.storage is not None and chosen.dataset is not None:
        out = chosen.storage.out
        try:
            store = ShardStore(out, chosen.dataset, chosen.storage.storage_options())
        except ValueError as err:
            raise CliError(f"--out {out}: {err}") from None
        version = ("--out", out, "--dataset", chosen.dataset)
    result = asyncio.run(
        audit(
            kafka,
            republish=chosen.republish,
            progress=sys.stderr.isatty(),
            store=store,
            dataset=chosen.dataset,
        )
    )
    command = republish_command(draftgen_command(), kafka, version)
    if chosen.as_json:
        print(orjson.dumps(result.as_json(command)).decode())
    elif chosen.republish:
        print(
            f"re-published {result.republished} prompts that had no outcome "
            f"(of {result.prompts} prompts)"
        )
    else:
        print("\n".join(result.lines(command)))
    if chosen.republish:
        return 0  # sent: the generate workers take them from here
    return 0 if result.complete else 1
