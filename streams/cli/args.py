"""Command-line flags shared by several commands: observability (metrics, heartbeats), `status`,
the sample policy. Kept free of heavy imports: the CLI builds its parser from these."""

from __future__ import annotations

import argparse
import os

from streams.cli.arg_types import non_negative_float, positive_float, positive_int
from streams.core.errors import CliError
from streams.core.settings import (
    GenerateSettings,
    KafkaSettings,
    ObserveSettings,
    SamplePolicy,
    SamplingSettings,
    Secret,
    StorageSettings,
    TokenizeSettings,
)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def add_observe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        help="serve Prometheus /metrics on this port (0: a free one; default: off)",
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address /metrics binds to (default 127.0.0.1; 0.0.0.0 for a scraper elsewhere)",
    )
    parser.add_argument(
        "--heartbeat-interval",
        type=_seconds,
        default=5.0,
        help="seconds between heartbeats to the worker-stats topic (0: none; default 5)",
    )


def observe_settings(args: argparse.Namespace) -> ObserveSettings:
    # getattr: commands that reuse a worker handler without these flags get the defaults
    return ObserveSettings(
        metrics_port=getattr(args, "metrics_port", None),
        metrics_host=getattr(args, "metrics_host", "127.0.0.1"),
        heartbeat_s=getattr(args, "heartbeat_interval", 5.0),
    )


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", default=None, help="output root of the dataset versions (for samples and tokens)"
    )
    parser.add_argument(
        "--dataset",
        action="append",
        default=None,
        help="a dataset version, repeatable (default: every one found under --out)",
    )
    parser.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=5.0,
        default=None,
        metavar="SECONDS",
        help="refresh every SECONDS (default 5) until interrupted",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object (a line per refresh)")


# -- sample policy ------------------------------------------------------------------------


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    d = SamplePolicy()
    group = parser.add_argument_group("sample policy (dropped samples become dead letters)")
    add = group.add_argument
    add(
        "--on-length",
        choices=["drop", "keep"],
        default=d.length,
        help=f"outputs cut by max tokens, finish_reason=length (default {d.length})",
    )
    add(
        "--on-unclosed-think",
        choices=["drop", "keep"],
        default=d.unclosed_think,
        help=f"outputs that never closed </think>: all reasoning (default {d.unclosed_think})",
    )
    add(
        "--on-empty-answer",
        choices=["drop", "keep"],
        default=d.empty_answer,
        help=f"outputs without content or tool calls (default {d.empty_answer})",
    )
    add(
        "--max-seq-len",
        type=positive_int,
        default=d.max_seq_len,
        help="longest sample in tokens, prompt included (default: no limit)",
    )
    add(
        "--on-max-seq-len",
        choices=["drop", "truncate"],
        default=d.over_max_seq_len,
        help=f"samples longer than --max-seq-len (default {d.over_max_seq_len})",
    )
    add(
        "--min-loss-run",
        type=positive_int,
        default=d.min_loss_run,
        help=f"fewest consecutive supervised tokens a sample needs (default {d.min_loss_run})",
    )


def policy_from_args(args: argparse.Namespace) -> SamplePolicy:
    return SamplePolicy(
        length=args.on_length,
        unclosed_think=args.on_unclosed_think,
        empty_answer=args.on_empty_answer,
        max_seq_len=args.max_seq_len,
        over_max_seq_len=args.on_max_seq_len,
        min_loss_run=args.min_loss_run,
    )


def policy_flags(policy: SamplePolicy) -> list[str]:
    """The flags that give `policy` to a worker subprocess (`draftgen run`)."""
    flags = [
        "--on-length",
        policy.length,
        "--on-unclosed-think",
        policy.unclosed_think,
        "--on-empty-answer",
        policy.empty_answer,
        "--on-max-seq-len",
        policy.over_max_seq_len,
        "--min-loss-run",
        str(policy.min_loss_run),
    ]
    if policy.max_seq_len is not None:
        flags += ["--max-seq-len", str(policy.max_seq_len)]
    return flags


# -- stages ---------------------------------------------------------------------------------


def add_kafka(parser: argparse.ArgumentParser, required: bool = True) -> None:
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


def kafka_settings(args: argparse.Namespace) -> KafkaSettings:
    if not args.bootstrap:
        raise CliError("--bootstrap is required (or set DRAFTGEN_BOOTSTRAP)")
    return KafkaSettings.from_env(args.bootstrap, args.topic_prefix, args.partitions)


def add_sampling(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=non_negative_float, default=1.0)
    parser.add_argument("--top-p", type=positive_float, default=0.95)
    parser.add_argument("--max-tokens", type=positive_int, default=8192)
    parser.add_argument("--seed", type=int, default=None)


def add_generate(parser: argparse.ArgumentParser) -> None:
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
    add_sampling(parser)


def generate_settings(args: argparse.Namespace, server: str) -> GenerateSettings:
    api_key = os.environ.get("DRAFTGEN_API_KEY") or os.environ.get("OPENAI_API_KEY")
    return GenerateSettings(
        server=server,
        kafka=kafka_settings(args),
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


def add_tokenize(parser: argparse.ArgumentParser, out_required: bool = True) -> None:
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
    add_tokenize_checks(parser)


def add_tokenize_checks(parser: argparse.ArgumentParser) -> None:
    """Drift measurement and the sample policy: on the tokenize worker and on `run`."""
    parser.add_argument(
        "--no-drift",
        action="store_true",
        help="do not compare server ids with the rendering (saves a render + encode per sample)",
    )
    add_policy_arguments(parser)


def add_regen(parser: argparse.ArgumentParser) -> None:
    from streams.core.turns import FINAL, REGEN_MODES

    parser.add_argument(
        "--regen",
        choices=REGEN_MODES,
        default=FINAL,
        help="final: answer the last turn (default); every-turn: regenerate each assistant "
        "turn of conversations without tool results, one sample per turn",
    )


def tokenize_settings(args: argparse.Namespace, group_id: str | None = None) -> TokenizeSettings:
    return TokenizeSettings(
        tokenizer_dir=args.tokenizer,
        dataset=args.dataset,
        storage=StorageSettings.from_env(args.out),
        kafka=kafka_settings(args),
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
