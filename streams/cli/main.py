"""The `draftgen` command line. Bad arguments get one line, never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import signal
import sys
import typing
from collections.abc import Callable, Sequence
from importlib import import_module
from typing import NoReturn

from streams.core.errors import CliError
from streams.core.outage import quiet_repeats, short_error
from streams.core.settings.names import LogLevel
from streams.tools.export_formats import EXPORT_FORMATS

# name: (module under streams.cli, help). A command's module, and the settings classes its
# flags come from (pydantic), are imported only when that command is chosen: `draftgen --help`
# and a one-shot command start without the others' imports.
COMMANDS = {
    "run": ("run", "the whole pipeline in one command"),
    "publish": ("publish", "publish prompt sources to the prompts topic"),
    "worker": ("worker", "run one pipeline worker"),
    "replay": (
        "replay",
        "build a new dataset version from the stored completions (nothing regenerated)",
    ),
    "seal": ("seal", "wait until a dataset version has caught up, then write its manifest"),
    "dead-letters": ("dead_letters", "list dead letters; re-publish after a fix"),
    "audit": (
        "audit",
        "list every published prompt without an outcome; exit status 1 if any",
    ),
    "status": ("status", "where a run stands; --watch-s refreshes"),
    "export": ("export", f"a dataset version as a trainer's input ({', '.join(EXPORT_FORMATS)})"),
    "report": ("report", "what a dataset version holds: JSON, PNG plots, one HTML page"),
    "emulate-server": ("emulate", "an SGLang-compatible emulated server"),
    "stack": ("stack", "a local Kafka and S3 that stay up: up, down, status"),
}


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command named in `argv` (the first word that is not the global option's)."""
    words = iter(argv)
    for word in words:
        if word == "--log-level":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with `argv`, only the command it names gets its flags (the others are named
    with their help, enough for `draftgen --help` and for argparse's choice errors)."""
    parser = Parser(prog="draftgen", description=__doc__)
    # LogSettings.log_level's flag, spelled here so that the parser needs no settings class
    # (pydantic); `main` validates it through LogSettings all the same.
    parser.add_argument(
        "--log-level",
        choices=typing.get_args(LogLevel),
        type=str.upper,
        default=argparse.SUPPRESS,
        help="(default WARNING)",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    wanted = chosen_command(argv) if argv is not None else None
    for name, (module, help_text) in COMMANDS.items():
        command = commands.add_parser(name, help=help_text)
        if argv is None or name == wanted:
            import_module(f"streams.cli.{module}").add_arguments(command)
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
ONE_SHOT = ("publish", "dead-letters", "audit", "seal", "export", "report")


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
    words = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(words).parse_args(words)
    # `kill -USR1 <pid>` prints every thread's stack: the first thing to look at in a stall.
    with contextlib.suppress(ValueError, OSError, AttributeError):  # stderr without a file
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        from streams.cli.flags import build
        from streams.core.settings import LogSettings

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
