"""`draftgen emulate-server`'s flags, named after SGLang's where SGLang has one, and the
settings (settings.py) they fill; a rule across flags that fails is one line."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compose.emulator.settings import SERVER_KINDS, EmulatorSettings
from compose.emulator.token_ids import IDS_STYLES
from streams.core.errors import CliError
from streams.core.families import FAMILIES


def _number(kind: type, low: float, high: float = math.inf, what: str = "") -> Callable[[str], Any]:
    noun = "an integer" if kind is int else "a number"
    allowed = what or (
        f"{noun} in [{low:g}, {high:g}]" if high < math.inf else f"{noun} >= {low:g}"
    )

    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: use {allowed}") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"{text!r}: use {allowed}")
        return value

    convert.__name__ = kind.__name__
    return convert


def _token_range(text: str) -> tuple[int, int]:
    """`A-B`: a range of output tokens, both ends included."""
    low, sep, high = text.partition("-")
    try:
        bounds = (int(low), int(high))
    except ValueError:
        bounds = (0, 0)
    if not sep or not 1 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: use A-B with 1 <= A <= B, such as 3000-6000")
    return bounds


_token_range.__name__ = "range"


def _existing(kind: str) -> Callable[[str], Path]:
    def convert(text: str) -> Path:
        path = Path(text)
        if not (path.is_dir() if kind == "directory" else path.is_file()):
            raise argparse.ArgumentTypeError(f"{text!r}: no such {kind}")
        return path

    convert.__name__ = kind
    return convert


_RATE = _number(float, 0.0, 1.0, "a probability in [0, 1]")
_COUNT = _number(int, 0)  # 0: unbounded / none
_POSITIVE = _number(int, 1)
_SECONDS = _number(float, 0.0)


def add_emulator_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `draftgen emulate-server`, named after SGLang's where SGLang has one, in groups
    for `--help`: the server, its answers, how it serves, the faults it injects."""
    defaults = EmulatorSettings(tokenizer_dir=Path("."))
    for add_group in (_server_flags, _answer_flags, _serving_flags, _fault_flags):
        add_group(parser, defaults)


def _server_flags(parser: argparse.ArgumentParser, d: EmulatorSettings) -> None:
    """Which server and model it imitates."""
    add = parser.add_argument_group("the server").add_argument
    add(
        "--tokenizer-dir",
        "--tokenizer",
        dest="tokenizer_dir",
        required=True,
        type=_existing("directory"),
        metavar="DIR",
        help="tokenizer directory (--tokenizer: the earlier spelling, accepted until 0.2)",
    )
    add("--host", default=d.host, help="address to listen on (default 127.0.0.1)")
    add(
        "--port",
        type=_number(int, 0, 65535, "a port in 1-65535, or 0 for a free one"),
        default=d.port,
        help="0 picks a free port",
    )
    add("--model", default="", help="served model name (default: the tokenizer dir name)")
    known = ", ".join(FAMILIES)
    add("--family", default=None, help=f"model family override: {known}")
    add("--max-model-len", type=_POSITIVE, default=d.max_model_len, help="context length")
    add(
        "--ids-style",
        choices=IDS_STYLES,
        default=d.ids_style,
        help="how chat completions return exact token ids (a server version's way)",
    )
    add(
        "--kind",
        choices=SERVER_KINDS,
        default=d.kind,
        help="the server to imitate: its routes, token-id shape and chat preprocessing",
    )
    add(
        "--version",
        default=None,
        metavar="X.Y.Z",
        help=f"the version to report and whose chat preprocessing to imitate (default: SGLang "
        f"{d.sglang_version}, vLLM {d.vllm_version})",
    )
    add(
        "--sglang-version",
        default=None,
        metavar="X.Y.Z",
        help="the same as --version, for --kind sglang",
    )


def _answer_flags(parser: argparse.ArgumentParser, d: EmulatorSettings) -> None:
    """What the answers are: lengths, thinking, tool calls, junk."""
    add = parser.add_argument_group("answers").add_argument
    add(
        "--min-output-tokens",
        type=_POSITIVE,
        default=d.min_output_tokens,
        help="shortest answer, in tokens",
    )
    add(
        "--max-output-tokens",
        type=_POSITIVE,
        default=d.max_output_tokens,
        help="longest answer, in tokens (uniform in [min, max] without --mean-output-tokens)",
    )
    add("--mean-output-tokens", type=_POSITIVE, default=None, help="log-normal lengths around this")
    add(
        "--long-fraction",
        type=_RATE,
        default=d.long_fraction,
        help="this fraction of prompts gets a length from --long-output-tokens (a long tail)",
    )
    add(
        "--long-output-tokens",
        type=_token_range,
        default=d.long_output_tokens,
        metavar="A-B",
        help="the long prompts' output length, uniform in [A, B] tokens (default 3000-6000)",
    )
    add(
        "--thinking-fraction",
        type=_RATE,
        default=d.thinking_fraction,
        help="share of an answer spent thinking, when thinking is on",
    )
    add(
        "--unclosed-think-rate",
        type=_RATE,
        default=d.unclosed_think_rate,
        help="fraction of thinking answers that never close </think>",
    )
    add(
        "--loop-rate",
        type=_RATE,
        default=d.loop_rate,
        help="fraction of prompts whose answer loops: a paragraph repeated over most of the "
        "output, then a stop",
    )
    add(
        "--think-leak-rate",
        type=_RATE,
        default=d.think_leak_rate,
        help="fraction of prompts whose answer keeps a stray think close (reasoning leaked)",
    )
    add(
        "--tool-call-rate",
        type=_RATE,
        default=d.tool_call_rate,
        help="fraction of requests with tools answered by a tool call",
    )
    add(
        "--seed",
        type=int,
        default=d.seed,
        help="seed of the answers, lengths and faults (the same on every server with it)",
    )
    add(
        "--script",
        type=_existing("file"),
        default=None,
        metavar="FILE",
        help='JSON lines {"match", "output"}: the output text of prompts containing match',
    )


def _serving_flags(parser: argparse.ArgumentParser, d: EmulatorSettings) -> None:
    """How it serves: speed, capacity, start-up, the API key, its log."""
    add = parser.add_argument_group("serving").add_argument
    add("--tokens-per-s", type=_SECONDS, default=d.tokens_per_s, help="decode speed; 0 = instant")
    add(
        "--max-running-requests",
        type=_COUNT,
        default=d.max_running_requests,
        help="requests decoded at once, as SGLang's flag (0: unbounded)",
    )
    add(
        "--max-queued-requests",
        type=_COUNT,
        default=d.max_queued_requests,
        help="requests waiting beyond those, as SGLang's flag; more get 503 (0: unbounded)",
    )
    add(
        "--startup-delay-s",
        type=_SECONDS,
        default=d.startup_delay_s,
        help="seconds /health_generate answers 503 after start, as while loading weights",
    )
    add(
        "--health-check-timeout-s",
        type=_SECONDS,
        default=d.health_check_timeout_s,
        help="seconds /health_generate waits for the engine's next output before it answers "
        "503, as SGLang's SGLANG_HEALTH_CHECK_TIMEOUT (a server whose every slot is busy "
        "answers only once one frees)",
    )
    add(
        "--api-key",
        default=None,
        help="require `Authorization: Bearer KEY` on every route but /health*, as SGLang's",
    )
    add(
        "--auth-status",
        type=int,
        choices=(401, 403),
        default=d.auth_status,
        help="the status of a request without the key (SGLang: 401)",
    )
    add(
        "--request-log",
        type=Path,
        default=None,
        metavar="FILE",
        help="append a JSON line per generation request: its prompt's digest, times, outcome",
    )


def _fault_flags(parser: argparse.ArgumentParser, d: EmulatorSettings) -> None:
    """The failures it injects, each at a rate."""
    add = parser.add_argument_group("faults").add_argument
    add(
        "--fail-400-rate",
        type=_RATE,
        default=d.rate_400_context,
        help="fraction of prompts always refused as too long for the context (400)",
    )
    add("--fail-503-rate", type=_RATE, default=d.rate_503, help="fraction of requests given a 503")
    add("--fail-500-rate", type=_RATE, default=d.rate_500, help="fraction of requests given a 500")
    add(
        "--timeout-rate",
        type=_RATE,
        default=d.rate_timeout,
        help="fraction of requests that hang --timeout-hang-s, then reset the connection",
    )
    add(
        "--timeout-hang-s",
        type=_SECONDS,
        default=d.timeout_hang_s,
        help="how long such a request hangs",
    )
    add(
        "--drop-rate",
        type=_RATE,
        default=d.rate_drop,
        help="fraction of requests whose connection closes in the middle of the answer",
    )
    add(
        "--refuse-all",
        type=int,
        default=d.refuse_status,
        metavar="STATUS",
        help="answer every generation request with this HTTP status (404: a wrong served model "
        "name) while health checks pass",
    )
    add(
        "--crash-on",
        default=d.crash_on,
        metavar="TEXT",
        help="a prompt containing TEXT crashes the server: the process exits at once (134)",
    )
    add(
        "--drift-rate",
        type=_RATE,
        default=d.drift_rate,
        help="fraction of prompts answered in other tokens than their text's encoding",
    )


def settings_from_args(args: argparse.Namespace) -> EmulatorSettings:
    """The settings of the flags; a rule across flags that fails is one line (a CliError)."""
    try:
        return _settings(args)
    except ValueError as err:
        raise CliError(str(err)) from None


def _settings(args: argparse.Namespace) -> EmulatorSettings:
    return EmulatorSettings(
        tokenizer_dir=args.tokenizer_dir,
        host=args.host,
        port=args.port,
        model=args.model,
        family=args.family,
        max_model_len=args.max_model_len,
        ids_style=args.ids_style,
        kind=args.kind,
        sglang_version=args.version or args.sglang_version or EmulatorSettings.sglang_version,
        vllm_version=args.version or EmulatorSettings.vllm_version,
        min_output_tokens=args.min_output_tokens,
        max_output_tokens=args.max_output_tokens,
        mean_output_tokens=args.mean_output_tokens,
        long_fraction=args.long_fraction,
        long_output_tokens=args.long_output_tokens,
        thinking_fraction=args.thinking_fraction,
        unclosed_think_rate=args.unclosed_think_rate,
        tool_call_rate=args.tool_call_rate,
        loop_rate=args.loop_rate,
        think_leak_rate=args.think_leak_rate,
        tokens_per_s=args.tokens_per_s,
        max_running_requests=args.max_running_requests,
        max_queued_requests=args.max_queued_requests,
        startup_delay_s=args.startup_delay_s,
        health_check_timeout_s=args.health_check_timeout_s,
        api_key=args.api_key,
        auth_status=args.auth_status,
        rate_400_context=args.fail_400_rate,
        rate_503=args.fail_503_rate,
        rate_500=args.fail_500_rate,
        rate_timeout=args.timeout_rate,
        timeout_hang_s=args.timeout_hang_s,
        refuse_status=args.refuse_all,
        crash_on=args.crash_on,
        rate_drop=args.drop_rate,
        drift_rate=args.drift_rate,
        seed=args.seed,
        script=args.script,
        request_log=args.request_log,
    )
