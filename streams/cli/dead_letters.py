"""`draftgen dead-letters`: dead letters by stage and reason, and every failed prompt (prompt id,
source id, stage, reason; `--as-json` too); re-publish them after a fix."""

from __future__ import annotations

import argparse
import asyncio

from streams.cli.flags import add_flags, build
from streams.core.settings import DeadLetterSelection, KafkaSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, DeadLetterSelection)
    add_flags(parser, KafkaSettings)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import orjson

    from streams.tools.dead_letters import Selection, as_json, listing, read_dead_letters, republish

    kafka = build(KafkaSettings, args)
    chosen = build(DeadLetterSelection, args)
    selection = Selection(chosen.stage, chosen.kind)
    if chosen.republish:
        sent, still_bad, left = asyncio.run(republish(kafka, selection))
        removed = ", ".join(f"{k} {n}" for k, n in sorted(left.items()))
        print(
            f"re-published {sent}"
            + "".join(f", still bad {k} {n}" for k, n in still_bad.items())
            + (f"; left as removed at publish: {removed} (--kind KIND sends them)" if left else "")
        )
        return 0
    letters = [x for x in asyncio.run(read_dead_letters(kafka)) if selection.matches(x)]
    if chosen.as_json:
        print(orjson.dumps(as_json(letters)).decode())
    else:
        print("\n".join(listing(letters)))
    return 0
