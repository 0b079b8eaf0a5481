"""The `draftgen` command line. Bad arguments get one line, never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from streams.cli import (
    dead_letters,
    emulate,
    export,
    publish,
    replay,
    report,
    run,
    seal,
    stack,
    status,
    worker,
)
from streams.cli.flags import add_flags, build
from streams.core.errors import CliError
from streams.core.outage import quiet_repeats, short_error
from streams.core.settings import LogSettings

COMMANDS = (
    run,
    publish,
    worker,
    replay,
    seal,
    dead_letters,
    status,
    export,
    report,
    emulate,
    stack,
)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="draftgen", description=__doc__)
    add_flags(parser, LogSettings)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.register(commands)
    return parser


def _known_errors() -> tuple[type[BaseException], ...]:
    from aiokafka.errors import KafkaError

    from compose.process import ServiceError
    from streams.core.families import TokenizerDirError

    # KafkaError: an unreachable broker or an invalid topic name, said in one line
    return (
        CliError,
        TokenizerDirError,
        ServiceError,
        FileNotFoundError,
        PermissionError,
        KafkaError,
    )


# commands that do one thing and end: a failure is their one line of output
ONE_SHOT = ("publish", "dead-letters", "seal", "export", "report")


def _configure_logging(level: str, command: str) -> None:
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # One line per HTTP request is per-record logging: keep the clients quiet at INFO.
    for noisy in ("httpx", "httpx2", "openai", "aiokafka"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    # A broker outage makes the clients log every reconnect attempt: one line per template
    # and 30 s (streams/core/outage.py); our own "unreachable since / reconnected after" say it.
    quiet_repeats()
    # Retried NotLeader answers on fresh partitions are routine, not worth a line each.
    logging.getLogger("aiokafka.producer.sender").setLevel(logging.ERROR)
    if command in ("run", "publish"):
        # Short-lived readers of just-created topics: aiokafka logs each internal retry of an
        # offset lookup on a partition whose leader is not elected yet as an ERROR.
        logging.getLogger("aiokafka.consumer.fetcher").setLevel(logging.CRITICAL)
    if command in ONE_SHOT:
        # A broker it cannot reach fails the command with one line (main); aiokafka's own
        # "Unable connect" ERROR before it would be a second.
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # `kill -USR1 <pid>` prints every thread's stack: the first thing to look at in a stall.
    with contextlib.suppress(ValueError, OSError, AttributeError):  # stderr without a file
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        args.log_level = build(LogSettings, args).log_level
        _configure_logging(args.log_level, args.command)
        return handler(args)
    except _known_errors() as err:
        print(f"draftgen {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        # A failure at run time (no network for an hf: source, a port taken): one line for the
        # operator, status 1; the traceback is for whoever asks for it.
        logging.getLogger("draftgen").debug("%s failed", args.command, exc_info=True)
        hint = (
            ""
            if logging.getLogger().isEnabledFor(logging.DEBUG)
            else " (--log-level DEBUG: traceback)"
        )
        print(f"draftgen {args.command}: error: {short_error(err)}{hint}", file=sys.stderr)
        return 1
