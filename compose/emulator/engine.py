"""The request path shared by /v1/chat/completions and /generate: checks, faults, queue, decode."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from compose.emulator import errors, faults
from compose.emulator.faults import Fault, FaultInjector
from compose.emulator.generation import Generation, GenerationRequest, Generator, prompt_unit
from compose.emulator.model import EmulatedModel
from compose.emulator.scheduler import Scheduler, Stats
from compose.emulator.settings import EmulatorSettings
from compose.emulator.transport import reset_connection
from streams.core.serving import profile_for_version


class ConnectionGone(Exception):
    """The connection was reset on purpose; there is nothing left to answer."""


@dataclass(frozen=True)
class Outcome:
    generation: Generation
    latency_s: float
    # answer with half a body, then reset the connection
    drop: bool = False


class Engine:
    """Everything a request needs, shared by the handlers (one per application)."""

    def __init__(self, settings: EmulatorSettings, model: EmulatedModel) -> None:
        self.settings = settings
        self.model = model
        # the request preprocessing of the server version it reports (SGLang's or vLLM's)
        self.normalization = profile_for_version(settings.version, settings.kind)
        # how that server flattens list content for this template
        self.content_format = self.normalization.template_content_format(
            getattr(model.tokenizer, "chat_template", None)
        )
        self.generator = Generator(model, settings)
        self.stats = Stats()
        self.scheduler = Scheduler(
            settings.max_running_requests, settings.max_queued_requests, self.stats
        )
        self.faults = FaultInjector(settings)
        self.ready_at = 0.0  # monotonic time; set when the server starts
        # outputs the engine produced, and set at the next one: SGLang's `last_receive_tstamp`,
        # which its /health_generate compares with the probe's start
        self.outputs = 0
        self._output = asyncio.Event()

    @property
    def ready(self) -> bool:
        return time.monotonic() >= self.ready_at

    async def wait_ready(self) -> None:
        delay = self.ready_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def check_context(self, prompt_text: str, prompt_len: int, max_new_tokens: int | None) -> None:
        """SGLang's tokenizer-manager checks, plus the injected per-prompt context failure (and
        a whole node's refusal, a prompt that crashes the server)."""
        faults.refuse_or_crash(self.settings, prompt_text)
        context_len = self.settings.max_model_len
        if prompt_len >= context_len:
            raise errors.context_too_long(prompt_len, context_len)
        if max_new_tokens is not None and prompt_len + max_new_tokens >= context_len:
            raise errors.total_too_long(prompt_len, max_new_tokens, context_len)
        rate = self.settings.rate_400_context
        if rate and prompt_unit(self.settings.seed, prompt_text, "ctx400") < rate:
            raise errors.context_too_long(context_len + prompt_len, context_len, "injected_400")

    async def run(self, request: web.Request, job: GenerationRequest) -> Outcome:
        """Generate for one request; raises ApiError (counted by the caller) or ConnectionGone."""
        start = time.monotonic()
        await self.wait_ready()
        fault = self.faults.draw()
        if fault is Fault.UNAVAILABLE:
            raise errors.queue_full(kind=fault.value)
        if fault is Fault.TIMEOUT:
            self.stats.errors[fault.value] += 1
            await asyncio.sleep(self.settings.timeout_hang_s)
            reset_connection(request)
            raise ConnectionGone()

        generation = self.generator.generate(job)
        decode_s = (
            len(generation.output_ids) / self.settings.tokens_per_s
            if self.settings.tokens_per_s > 0
            else 0.0
        )
        async with self.scheduler.slot():
            if fault is Fault.INTERNAL:
                await asyncio.sleep(decode_s / 2)
                raise errors.internal_error("the emulated engine failed", kind=fault.value)
            await asyncio.sleep(decode_s)
        self._produced()
        self.stats.completed += 1
        self.stats.prompt_tokens += job.prompt_len
        self.stats.completion_tokens += len(generation.output_ids)
        self.stats.drift += generation.drift
        self.stats.tool_calls += generation.tool_call
        if fault is Fault.DROP:
            self.stats.errors[fault.value] += 1
        return Outcome(generation, time.monotonic() - start, drop=fault is Fault.DROP)

    async def health_generate(self) -> bool:
        """SGLang's /health_generate: a 1-token request queued like any other, healthy once the
        engine produced an output (its own or any request's) since the probe began, within
        `health_check_timeout_s`. So a server whose every running slot is busy answers only
        once one frees, and one that produces nothing answers 503."""
        if not self.ready:
            return False
        seen = self.outputs
        probe = asyncio.ensure_future(self._one_token())
        try:
            async with asyncio.timeout(self.settings.health_check_timeout_s):
                while self.outputs == seen:
                    await self._output.wait()
            return True
        except TimeoutError:
            return False
        finally:
            probe.cancel()

    async def _one_token(self) -> None:
        tokens_per_s = self.settings.tokens_per_s
        try:
            async with self.scheduler.slot():
                await asyncio.sleep(1 / tokens_per_s if tokens_per_s > 0 else 0)
        except errors.ApiError:
            pass  # refused by a full queue: SGLang's abort reaches the tokenizer, an output too
        self._produced()

    def _produced(self) -> None:
        self.outputs += 1
        self._output.set()
        self._output = asyncio.Event()

    def server_info(self) -> dict[str, Any]:
        s = self.settings
        family = self.model.family
        return {
            "model_path": str(s.tokenizer_dir),
            "tokenizer_path": str(s.tokenizer_dir),
            "served_model_name": s.model,
            "host": s.host,
            "port": s.port,
            "context_length": s.max_model_len,
            "max_running_requests": s.max_running_requests or None,
            "max_queued_requests": s.max_queued_requests or None,
            "reasoning_parser": family.reasoning_parser,
            "tool_call_parser": family.tool_call_parser,
            "version": s.sglang_version,
            "emulator": {
                "family": family.name,
                "prefills_think": family.prefills_think,
                "tokens_per_s": s.tokens_per_s,
                "min_output_tokens": s.min_output_tokens,
                "max_output_tokens": s.max_output_tokens,
                "seed": s.seed,
            },
            "internal_states": [self._internal_state()],
        }

    def _internal_state(self) -> dict[str, Any]:
        """One data-parallel rank's state, as SGLang's scheduler reports it: its running cap
        (`effective_max_running_requests_per_dp`, newer servers) only when there is one."""
        state: dict[str, Any] = {"num_running": self.stats.running, "ready": self.ready}
        if self.settings.max_running_requests:
            state["effective_max_running_requests_per_dp"] = self.settings.max_running_requests
        return state


ENGINE_KEY = web.AppKey("engine", Engine)
