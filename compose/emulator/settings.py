"""Typed settings of the emulated SGLang server, and the command-line flags that fill them."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compose.emulator.token_ids import IDS_STYLES
from streams.core.errors import CliError
from streams.core.families import FAMILIES
from streams.core.serving import parse_version

SERVER_KINDS = ("sglang", "vllm")


@dataclass
class EmulatorSettings:
    tokenizer_dir: Path
    host: str = "127.0.0.1"
    port: int = 30000  # SGLang's default; 0 picks a free port
    # served model name; empty means the tokenizer directory's name
    model: str = ""
    # model family override (streams.core.families); None detects it from the template
    family: str | None = None
    max_model_len: int = 32768
    # how chat completions carry exact token ids: vLLM's, SGLang's ones, or none
    # (compose/emulator/token_ids.py)
    ids_style: str = "vllm"
    # the server it imitates: SGLang (its routes, /server_info) or vLLM (/version, /health,
    # /v1/*; ids the vLLM way)
    kind: str = "sglang"
    # the version it reports (SGLang's /server_info `version`, vLLM's /version) and whose
    # request preprocessing it imitates (streams/core/serving/)
    sglang_version: str = "0.5.23"
    vllm_version: str = "0.34.0"

    # Output length: uniform in [min, max] tokens, or log-normal around mean (clipped to them).
    min_output_tokens: int = 16
    max_output_tokens: int = 256
    mean_output_tokens: int | None = None
    # A long tail on top: this fraction of prompts (chosen by the prompt, so the same on every
    # server with the same seed) gets a length uniform in `long_output_tokens` instead, as a
    # reasoning model's few very long answers among many short ones.
    long_fraction: float = 0.0
    long_output_tokens: tuple[int, int] = (3000, 6000)
    # share of the output spent thinking, when thinking is on
    thinking_fraction: float = 0.6
    # fraction of thinking outputs that never close </think> (the whole output is reasoning)
    unclosed_think_rate: float = 0.0
    # fraction of requests with tools that answer with a tool call
    tool_call_rate: float = 0.0
    # junk a real model writes, for the quality gate (streams/tokenize/gate.py): a fraction of
    # prompts whose answer loops (one paragraph over and over, to the end, then a stop), and a
    # fraction whose answer keeps a think close the reasoning parser did not split at
    loop_rate: float = 0.0
    think_leak_rate: float = 0.0

    # decode speed per request; 0 answers at once
    tokens_per_s: float = 0.0
    # SGLang's --max-running-requests (0 = unbounded) and --max-queued-requests (0 = unbounded)
    max_running_requests: int = 0
    max_queued_requests: int = 0
    # seconds /health_generate answers 503 (and generation waits) after start, as while loading
    startup_delay_s: float = 0.0
    # SGLang's --api-key: every route but /health* wants `Authorization: Bearer <key>` and
    # answers 401 without it. A test may change it on a running server (`engine.settings`).
    api_key: str | None = None
    # what a request without the key gets: SGLang's 401, or 403 as an authorizing proxy answers
    auth_status: int = 401

    # Failure injection, each a probability per request.
    rate_400_context: float = 0.0  # per prompt: the same prompt always fails
    rate_503: float = 0.0
    rate_500: float = 0.0
    rate_timeout: float = 0.0  # hang timeout_hang_s, then reset the connection
    timeout_hang_s: float = 60.0
    rate_drop: float = 0.0  # close the connection in the middle of the response body
    # per prompt: output ids are a non-canonical tokenization of the output text
    drift_rate: float = 0.0
    seed: int = 0
    # JSON-lines file of {"match": str, "output": str}: a prompt containing `match` gets
    # `output` as the text the model writes (compose/emulator/generation.py), first match wins
    script: Path | None = None
    # JSON-lines file: one line per generation request, naming its prompt by a digest of its
    # messages and how it ended (compose/emulator/request_log.py); None writes nothing
    request_log: Path | None = None

    @property
    def version(self) -> str:
        """The version it reports, of its kind."""
        return self.vllm_version if self.kind == "vllm" else self.sglang_version

    def __post_init__(self) -> None:
        self.tokenizer_dir = Path(self.tokenizer_dir)
        if not self.model:
            self.model = self.tokenizer_dir.resolve().name
        if self.ids_style not in IDS_STYLES:
            raise ValueError(f"ids_style must be one of {IDS_STYLES}, got {self.ids_style!r}")
        if self.kind not in SERVER_KINDS:
            raise ValueError(f"kind must be one of {SERVER_KINDS}, got {self.kind!r}")
        for name in ("sglang_version", "vllm_version"):
            if parse_version(getattr(self, name)) is None:
                raise ValueError(
                    f"{name} must be a version like 0.5.23, got {getattr(self, name)!r}"
                )
        if self.kind == "vllm":
            self.ids_style = "vllm"  # vLLM has one way: `return_token_ids`
        if self.auth_status not in (401, 403):
            raise ValueError(f"auth_status must be 401 or 403, got {self.auth_status}")
        if self.min_output_tokens < 1 or self.max_output_tokens < self.min_output_tokens:
            raise ValueError(
                "need 1 <= min_output_tokens <= max_output_tokens (--min-output-tokens, "
                "--max-output-tokens)"
            )
        low, high = self.long_output_tokens
        if not 1 <= low <= high:
            raise ValueError(f"need 1 <= A <= B in --long-output-tokens A-B, got {low}-{high}")
        for name in (
            "long_fraction",
            "thinking_fraction",
            "unclosed_think_rate",
            "tool_call_rate",
            "loop_rate",
            "think_leak_rate",
            "rate_400_context",
            "rate_503",
            "rate_500",
            "rate_timeout",
            "rate_drop",
            "drift_rate",
        ):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {value}")


# Flag types that check the range where the flag is declared: argparse then says what is wrong
# in one line naming the flag (exit status 2), as for every other command.


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
        api_key=args.api_key,
        auth_status=args.auth_status,
        rate_400_context=args.fail_400_rate,
        rate_503=args.fail_503_rate,
        rate_500=args.fail_500_rate,
        rate_timeout=args.timeout_rate,
        timeout_hang_s=args.timeout_hang_s,
        rate_drop=args.drop_rate,
        drift_rate=args.drift_rate,
        seed=args.seed,
        script=args.script,
        request_log=args.request_log,
    )
