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

from streams.arg_types import non_negative_float, positive_float, positive_int
from streams.policies import add_policy_arguments, policy_from_args
from streams.settings import (
    GenerateSettings,
    KafkaSettings,
    SamplingSettings,
    Secret,
    StorageSettings,
    TokenizeSettings,
)


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _env_log_level() -> str:
    level = os.environ.get("DRAFTGEN_LOG_LEVEL", "WARNING").upper()
    return level if level in ("DEBUG", "INFO", "WARNING", "ERROR") else "WARNING"


def _add_kafka(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument(
        "--bootstrap",
        # the environment may give it instead of the flag
        required=required and not os.environ.get("DRAFTGEN_BOOTSTRAP"),
        default=os.environ.get("DRAFTGEN_BOOTSTRAP"),
        help="Kafka bootstrap servers host:port[,host:port]",
    )
    parser.add_argument("--topic-prefix", default="", help="prefix for topic and group names")
    parser.add_argument(
        "--partitions",
        type=positive_int,
        default=64,
        help="partitions for topics this command creates (default 64)",
    )


def _kafka(args: argparse.Namespace) -> KafkaSettings:
    if not args.bootstrap:
        raise CliError("--bootstrap is required (or set DRAFTGEN_BOOTSTRAP)")
    return KafkaSettings.from_env(args.bootstrap, args.topic_prefix, args.partitions)


def _add_sampling(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=non_negative_float, default=1.0)
    parser.add_argument("--top-p", type=positive_float, default=0.95)
    parser.add_argument("--max-tokens", type=positive_int, default=8192)
    parser.add_argument("--seed", type=int, default=None)


def _add_generate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        default=32,
        help="requests kept in flight against the server (default 32)",
    )
    parser.add_argument("--model", default=None, help="served model name (default: ask the server)")
    parser.add_argument(
        "--family",
        choices=["kimi_k2", "qwen3", "generic"],
        default=None,
        help="model family for the thinking kwarg (default: from the model name)",
    )
    parser.add_argument("--no-thinking", action="store_true", help="generate with thinking off")
    parser.add_argument(
        "--max-attempts",
        type=positive_int,
        default=5,
        help="attempts for transient errors before a dead letter (default 5)",
    )
    parser.add_argument("--request-timeout", type=positive_float, default=1800.0)
    parser.add_argument(
        "--instance-id",
        default=None,
        help="static group membership id: a restart does not rebalance",
    )
    _add_sampling(parser)


def _generate_settings(args: argparse.Namespace, server: str) -> GenerateSettings:
    api_key = os.environ.get("DRAFTGEN_API_KEY") or os.environ.get("OPENAI_API_KEY")
    return GenerateSettings(
        server=server,
        kafka=_kafka(args),
        concurrency=args.concurrency,
        sampling=SamplingSettings(args.temperature, args.top_p, args.max_tokens, args.seed),
        model=args.model,
        family=args.family,
        thinking=not args.no_thinking,
        api_key=Secret(api_key) if api_key else None,
        request_timeout_s=args.request_timeout,
        max_attempts=args.max_attempts,
        instance_id=args.instance_id,
    )


def _add_tokenize(parser: argparse.ArgumentParser, out_required: bool = True) -> None:
    parser.add_argument(
        "--tokenizer", required=out_required, help="the target's tokenizer directory"
    )
    parser.add_argument(
        "--out",
        required=out_required,
        help="output root: a local path, file:// or s3://bucket/prefix",
    )
    parser.add_argument("--dataset", required=out_required, help="dataset version name")
    parser.add_argument(
        "--chat-template", default=None, help="a .jinja file overriding the template"
    )
    parser.add_argument(
        "--family",
        choices=["kimi_k2", "qwen3", "generic"],
        default=None,
        help="model family (default: detected from the tokenizer's template)",
    )
    parser.add_argument(
        "--token-source",
        choices=["server", "rendered"],
        default="server",
        help="which ids to store when the server returned its own (default server)",
    )
    parser.add_argument("--shard-records", type=positive_int, default=2000)
    parser.add_argument("--shard-tokens", type=positive_int, default=8_000_000)
    parser.add_argument(
        "--idle-flush",
        type=float,
        default=10.0,
        help="seconds before an idle partition's open shard is written",
    )
    _add_tokenize_checks(parser)


def _add_tokenize_checks(parser: argparse.ArgumentParser) -> None:
    """Drift measurement and the sample policy: on the tokenize worker and on `run`."""
    parser.add_argument(
        "--no-drift",
        action="store_true",
        help="do not compare server ids with the rendering (saves a render + encode per sample)",
    )
    add_policy_arguments(parser)


def _add_regen(parser: argparse.ArgumentParser) -> None:
    from streams.regen import FINAL, REGEN_MODES

    parser.add_argument(
        "--regen",
        choices=REGEN_MODES,
        default=FINAL,
        help="final: answer the last turn (default); every-turn: regenerate each assistant "
        "turn of conversations without tool results, one sample per turn",
    )


def _tokenize_settings(args: argparse.Namespace, group_id: str | None = None) -> TokenizeSettings:
    return TokenizeSettings(
        tokenizer_dir=args.tokenizer,
        dataset=args.dataset,
        storage=StorageSettings.from_env(args.out),
        kafka=_kafka(args),
        family=args.family,
        chat_template_file=args.chat_template,
        token_source=args.token_source,
        shard_max_records=args.shard_records,
        shard_max_tokens=args.shard_tokens,
        idle_flush_s=args.idle_flush,
        group_id=group_id,
        measure_drift=not args.no_drift,
        policy=policy_from_args(args),
    )


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
            _kafka(args),
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
    from streams.faust_app import run_worker
    from streams.generate_app import build_generate_app
    from streams.generate_once import once_from_args
    from streams.observe_args import observe_settings
    from streams.topics import ensure_topics

    settings = _generate_settings(args, args.server)
    asyncio.run(ensure_topics(settings.kafka))
    app, _ = build_generate_app(settings, observe_settings(args), once_from_args(args))
    run_worker(app, args.log_level)
    return 0


def cmd_worker_tokenize(args: argparse.Namespace, group_id: str | None = None) -> int:
    from sinks.shards import ShardStore
    from streams.faust_app import run_worker
    from streams.observe_args import observe_settings
    from streams.tokenize_app import build_tokenize_app, manifest
    from streams.tokenizer_loading import load_tokenizer
    from streams.topics import ensure_topics

    settings = _tokenize_settings(args, group_id)
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
    from streams.dead_letters import Selection, read_dead_letters, republish, summarize

    kafka = _kafka(args)
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
    from streams.status import run_status

    return run_status(args, _kafka(args))


def cmd_emulate_server(args: argparse.Namespace) -> int:
    from compose.emulator.server import run
    from compose.emulator.settings import settings_from_args

    run(settings_from_args(args))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from streams.run import run_pipeline

    return run_pipeline(args)


# -- parser --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from streams.observe_args import add_observe_arguments, add_status_arguments

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
    _add_generate(run)
    _add_regen(run)
    _add_tokenize_checks(run)

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
    _add_regen(publish)
    _add_kafka(publish)
    publish.set_defaults(handler=cmd_publish)

    worker = commands.add_parser("worker", help="run one pipeline worker")
    workers = worker.add_subparsers(dest="worker", required=True, parser_class=_Parser)
    generate = workers.add_parser(
        "generate", help="one generation worker bound to one SGLang server"
    )
    generate.add_argument("--server", required=True, help="the SGLang server's base URL")
    _add_kafka(generate)
    _add_generate(generate)
    from streams.generate_once import add_once_arguments

    add_once_arguments(generate)
    add_observe_arguments(generate)
    generate.set_defaults(handler=cmd_worker_generate)
    tokenize = workers.add_parser("tokenize", help="completions → Arrow shards for one dataset")
    _add_kafka(tokenize)
    _add_tokenize(tokenize)
    add_observe_arguments(tokenize)
    tokenize.set_defaults(handler=cmd_worker_tokenize)

    from streams.replay import add_replay_command

    add_replay_command(commands)

    dead = commands.add_parser("dead-letters", help="list dead letters; re-publish after a fix")
    dead.add_argument("--stage", choices=["publish", "generate", "tokenize"], default=None)
    dead.add_argument("--kind", default=None, help="reason kind, a glob (e.g. 'http_*')")
    dead.add_argument(
        "--republish",
        action="store_true",
        help="send the selected letters' payloads back to their stage's input topic",
    )
    _add_kafka(dead)
    dead.set_defaults(handler=cmd_dead_letters)

    status = commands.add_parser("status", help="where a run stands; --watch refreshes")
    _add_kafka(status)
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
    from streams.families import TokenizerDirError

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
