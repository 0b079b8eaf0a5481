"""Typed settings of the emulated SGLang server (its command-line flags: flags.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from compose.emulator.token_ids import IDS_STYLES
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
    # how long /health_generate waits for the engine's next output before its 503: SGLang's
    # SGLANG_HEALTH_CHECK_TIMEOUT (a server whose every running slot is busy answers late)
    health_check_timeout_s: float = 20.0
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
    # a node misconfigured as a whole: every generation request answers this status (404: a
    # wrong served model name) while its health checks pass; 0 = none
    refuse_status: int = 0
    # a prompt containing this text takes the server down as it arrives (a kernel assertion,
    # an OOM on its shape): the process exits at once, its other requests cut; "" = none
    crash_on: str = ""
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
        if self.refuse_status and not 400 <= self.refuse_status < 600:
            raise ValueError(f"refuse_status must be an error status, got {self.refuse_status}")
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
