"""Command-line flags and settings of the observability parts: worker metrics and heartbeats,
and `draftgen status`. Kept free of heavy imports: the CLI builds its parser from these."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class ObserveSettings:
    metrics_port: int | None = None  # None: no /metrics endpoint; 0: a free port
    metrics_host: str = "127.0.0.1"
    heartbeat_s: float = 5.0  # 0: no heartbeats (the worker is then invisible to `status`)
    rate_window_s: float = 30.0


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
