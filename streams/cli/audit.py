"""`draftgen audit`: every published prompt without an outcome (no completion, dead letter or
ledger mark), and the one command that republishes them; exit status 1 if any."""

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
    import orjson

    from streams.cli.run import draftgen_command
    from streams.tools.audit import audit, republish_command

    kafka = build(KafkaSettings, args)
    chosen = build(AuditSettings, args)
    result = asyncio.run(audit(kafka, republish=chosen.republish, progress=sys.stderr.isatty()))
    command = republish_command(draftgen_command(), kafka)
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
