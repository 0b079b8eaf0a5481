"""The `draftgen` command line. Bad arguments get one line, never a traceback."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from streams.cli.arg_types import positive_int
from streams.cli.args import (
    add_generate,
    add_kafka,
    add_regen,
    add_tokenize,
    add_tokenize_checks,
    generate_settings,
    kafka_settings,
    tokenize_settings,
)
from streams.core.errors import CliError
from streams.core.settings import (
    StorageSettings,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _env_log_level() -> str:
    level = os.environ.get("DRAFTGEN_LOG_LEVEL", "WARNING").upper()
    return level if level in ("DEBUG", "INFO", "WARNING", "ERROR") else "WARNING"


# -- commands ------------------------------------------------------------------------------------


def cmd_publish(args: argparse.Namespace) -> int:
    from producers.publish import publish
    from producers.sources import bundled_sample_path, parse_source_spec

    sources = args.sources or [str(bundled_sample_path())]
    try:
        specs = [parse_source_spec(s) for s in sources]
    except ValueError as err:
        raise CliError(str(err)) from None
    storage = StorageSettings.from_env("s3://")
    summary = asyncio.run(
        publish(
            kafka_settings(args),
            specs,
            args.limit,
            storage.storage_options(),
            not args.no_progress,
            regen=args.regen,
            regenerate=args.regenerate,
        )
    )
    print(summary.line())
    return 0


def cmd_worker_generate(args: argparse.Namespace) -> int:
    from streams.cli.args import observe_settings
    from streams.core.faust_app import run_worker
    from streams.core.topics import ensure_topics
    from streams.generate.app import build_generate_app
    from streams.generate.once import once_from_args

    settings = generate_settings(args, args.server)
    asyncio.run(ensure_topics(settings.kafka))
    app, _ = build_generate_app(settings, observe_settings(args), once_from_args(args))
    run_worker(app, args.log_level)
    return 0


def cmd_worker_tokenize(args: argparse.Namespace, group_id: str | None = None) -> int:
    from sinks.shards import ShardStore
    from streams.cli.args import observe_settings
    from streams.core.faust_app import run_worker
    from streams.core.topics import ensure_topics
    from streams.tokenize.app import build_tokenize_app, manifest
    from streams.tokenize.loading import load_tokenizer

    settings = tokenize_settings(args, group_id)
    loaded = load_tokenizer(settings.tokenizer_dir, settings.chat_template_file, settings.family)
    try:
        store = ShardStore(
            settings.storage.out, settings.dataset, settings.storage.storage_options()
        )
    except ValueError as err:
        raise CliError(f"--out {settings.storage.out}: {err}") from None
    try:
        store.write_manifest(manifest(settings, loaded))
    except Exception as err:
        raise CliError(
            f"cannot write to {store.url}: {type(err).__name__}: "
            f"{str(err).splitlines()[0][:200] if str(err) else ''}"
        ) from None
    asyncio.run(ensure_topics(settings.kafka))
    app, _ = build_tokenize_app(settings, loaded, store, observe_settings(args))
    run_worker(app, args.log_level)
    return 0


def cmd_dead_letters(args: argparse.Namespace) -> int:
    from streams.ops.dead_letters import Selection, read_dead_letters, republish, summarize

    kafka = kafka_settings(args)
    selection = Selection(args.stage, args.kind)
    if args.republish:
        sent, still_bad = asyncio.run(republish(kafka, selection))
        print(
            f"re-published {sent}" + "".join(f", still bad {k} {n}" for k, n in still_bad.items())
        )
        return 0
    letters = [x for x in asyncio.run(read_dead_letters(kafka)) if selection.matches(x)]
    print("\n".join(summarize(letters)))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from streams.ops.status import run_status

    return run_status(args, kafka_settings(args))


def cmd_emulate_server(args: argparse.Namespace) -> int:
    from compose.emulator.server import run
    from compose.emulator.settings import settings_from_args

    run(settings_from_args(args))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from streams.cli.run import run_pipeline

    return run_pipeline(args)


# -- parser --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from streams.cli.args import add_observe_arguments, add_status_arguments

    parser = _Parser(prog="draftgen", description=__doc__)
    parser.add_argument(
        "--log-level",
        default=_env_log_level(),
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = commands.add_parser("run", help="the whole pipeline in one command")
    run.add_argument("sources", nargs="*", help="prompt sources (default: the bundled samples)")
    run.add_argument("--bootstrap", default=None, help="an existing Kafka (default: start one)")
    run.add_argument(
        "--server",
        action="append",
        default=None,
        help="an SGLang server URL, repeatable (default: start emulated servers)",
    )
    run.add_argument(
        "--servers",
        type=positive_int,
        default=2,
        help="how many emulated servers to start when no --server (default 2)",
    )
    run.add_argument("--out", default=None, help="output root (default: runs/<time>/out)")
    run.add_argument("--dataset", default="sample", help="dataset version name (default sample)")
    run.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer directory (default: the bundled tiny Qwen3.6-format one)",
    )
    run.add_argument("--limit", type=positive_int, default=None)
    run.add_argument(
        "--workdir", default=None, help="logs and local services (default runs/<time>)"
    )
    run.add_argument(
        "--timeout", type=float, default=3600.0, help="give up if not done after this many seconds"
    )
    run.add_argument("--topic-prefix", default="")
    run.add_argument("--partitions", type=positive_int, default=64)
    run.add_argument(
        "--emulator-tokens-per-s",
        type=float,
        default=2000.0,
        help="decode speed of emulated servers, per request",
    )
    add_generate(run)
    add_regen(run)
    add_tokenize_checks(run)

    publish = commands.add_parser("publish", help="publish prompt sources to the prompts topic")
    publish.add_argument(
        "sources",
        nargs="*",
        help="JSONL/Parquet paths or URLs, hf:NAME[:SPLIT], each optionally PATH:WEIGHT",
    )
    publish.add_argument("--limit", type=positive_int, default=None)
    publish.add_argument("--no-progress", action="store_true")
    publish.add_argument(
        "--regenerate",
        action="store_true",
        help="publish and generate prompts even if the `generated` ledger has them",
    )
    add_regen(publish)
    add_kafka(publish)
    publish.set_defaults(handler=cmd_publish)

    worker = commands.add_parser("worker", help="run one pipeline worker")
    workers = worker.add_subparsers(dest="worker", required=True, parser_class=_Parser)
    generate = workers.add_parser(
        "generate", help="one generation worker bound to one SGLang server"
    )
    generate.add_argument("--server", required=True, help="the SGLang server's base URL")
    add_kafka(generate)
    add_generate(generate)
    from streams.generate.once import add_once_arguments

    add_once_arguments(generate)
    add_observe_arguments(generate)
    generate.set_defaults(handler=cmd_worker_generate)
    tokenize = workers.add_parser("tokenize", help="completions → Arrow shards for one dataset")
    add_kafka(tokenize)
    add_tokenize(tokenize)
    add_observe_arguments(tokenize)
    tokenize.set_defaults(handler=cmd_worker_tokenize)

    from streams.cli.replay import add_replay_command

    add_replay_command(commands)

    dead = commands.add_parser("dead-letters", help="list dead letters; re-publish after a fix")
    dead.add_argument("--stage", choices=["publish", "generate", "tokenize"], default=None)
    dead.add_argument("--kind", default=None, help="reason kind, a glob (e.g. 'http_*')")
    dead.add_argument(
        "--republish",
        action="store_true",
        help="send the selected letters' payloads back to their stage's input topic",
    )
    add_kafka(dead)
    dead.set_defaults(handler=cmd_dead_letters)

    status = commands.add_parser("status", help="where a run stands; --watch refreshes")
    add_kafka(status)
    add_status_arguments(status)
    status.set_defaults(handler=cmd_status)

    emulate = commands.add_parser("emulate-server", help="an SGLang-compatible emulated server")
    from compose.emulator.settings import add_emulator_arguments

    add_emulator_arguments(emulate)
    emulate.set_defaults(handler=cmd_emulate_server)
    run.set_defaults(handler=cmd_run)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # One line per HTTP request is per-record logging: keep the clients quiet at INFO.
    for noisy in ("httpx", "httpx2", "openai", "aiokafka"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    # Retried NotLeader answers on fresh partitions are routine, not worth a line each.
    logging.getLogger("aiokafka.producer.sender").setLevel(logging.ERROR)
    if args.command in ("run", "publish"):
        # Short-lived readers of just-created topics: aiokafka logs each internal retry of an
        # offset lookup on a partition whose leader is not elected yet as an ERROR.
        logging.getLogger("aiokafka.consumer.fetcher").setLevel(logging.CRITICAL)
    # `kill -USR1 <pid>` prints every thread's stack: the first thing to look at in a stall.
    with contextlib.suppress(ValueError, OSError, AttributeError):  # stderr without a file
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except _known_errors() as err:
        print(f"draftgen {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
