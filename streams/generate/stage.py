"""The generate stage: one prompt in, its outputs out, delivered.

A prompt becomes one `Completion`, one per turn (`--regen every-turn`), or its `Letter`. Transient
request errors are retried up to `max_attempts`; a server that is down or refuses the API key
closes the gate (streams/generate/gate.py) instead, spending nothing of the prompt. Any
exception while handling one prompt becomes that prompt's dead letter, never a crash. Without
the ledger, a prompt no longer ours (`owned()` false: its partition revoked meanwhile) gets no
dead letter from here: its new owner redoes it and decides (a completion is still sent: the
tokenize stage keeps one). With the ledger, the worker holding a prompt's claim decides its
outcome (streams/generate/once.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

from streams.core.crash_guard import CRASH_LOOP
from streams.core.normalize import validate_prompt_messages
from streams.core.records import CompletionRecord, DeadLetter, PromptRecord, RecordError
from streams.core.retry import Backoff
from streams.core.settings import GenerateSettings
from streams.generate import regen
from streams.generate.client import AUTH, SLOW, GenerationError
from streams.generate.outputs import Completion, Letter, Outbox, Output
from streams.generate.ports import Gate, ServerClient
from streams.generate.slots import Slots
from streams.generate.stats import GenerateStats

log = logging.getLogger(__name__)

STAGE = "generate"


class Refused(Exception):
    """A request the server failed for good (`error`), raised instead of its dead letter when
    the caller decides who is to blame (streams/generate/blame.py)."""

    def __init__(self, error: GenerationError):
        super().__init__(str(error))
        self.error = error


Owned = Callable[[], bool]
# awaited before each request to the server; raises to end the prompt's requests there (its
# claim is no longer held: streams/generate/once.py)
BeforeRequest = Callable[[], Awaitable[None]]


class GenerateStage:
    def __init__(
        self,
        settings: GenerateSettings,
        client: ServerClient,
        gate: Gate,
        outbox: Outbox,
        stats: GenerateStats,
        backoff: Backoff,
        slots: Slots,
    ):
        self.settings = settings
        self.client = client
        self.gate = gate
        self.slots = slots
        self.outbox = outbox
        self.stats = stats
        self.backoff = backoff  # between attempts of a request that failed transiently

    async def handle(
        self, key: bytes | None, raw: bytes, owned: Owned, poisoned: str | None = None
    ) -> None:
        """Generate one prompt and deliver its outputs (the intake's `PromptStage`), in a request
        slot: without the ledger there are no claims, and a revoked prompt's request goes on."""

        async def outputs() -> list[Output]:
            if poisoned is not None:  # it crashed this worker twice: its dead letter, no retry
                return [self.dead_letter(CRASH_LOOP, poisoned, raw, _prompt_id(key))]
            async with self.slots.held():
                return await self.outputs(key, raw)

        await self.guarded(key, raw, owned, outputs)

    def requesting(self, key: bytes | None, raw: bytes) -> bool:
        return True  # no claims: a revoked prompt is redone by its new owner, this one goes on

    async def guarded(
        self,
        key: bytes | None,
        raw: bytes,
        owned: Owned,
        run: Callable[[], Awaitable[list[Output]]],
    ) -> None:
        """Deliver what `run()` returns; an exception is a bug, not bad input: the prompt's
        dead letter (if still ours), so that its partition moves on."""
        prompt_id = _prompt_id(key)
        try:
            for output in await run():
                if isinstance(output, Letter) and not owned():
                    continue  # revoked meanwhile: the new owner decides this prompt's outcome
                await self.deliver(output, raw, prompt_id, owned())
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.exception("unexpected failure on a prompt; sending it to dead letters")
            if owned():
                message = f"{type(err).__name__}: {err}"
                await self.outbox.send_letter(
                    self.dead_letter("internal_error", message, raw, prompt_id)
                )

    async def outputs(
        self,
        key: bytes | None,
        value: bytes,
        before: BeforeRequest | None = None,
        defer_refusals: bool = False,
    ) -> list[Output]:
        """Every output of one prompt, for the caller to deliver: one, or one per turn.
        `defer_refusals`: a request the server fails for good raises `Refused` (no output, for
        any turn) instead of becoming the prompt's dead letter."""
        outputs = await self._outputs(key, value, before, defer_refusals)
        return [self._fitting(output, value) for output in outputs]

    async def _outputs(
        self, key: bytes | None, value: bytes, before: BeforeRequest | None, defer: bool
    ) -> list[Output]:
        planned = regen.conversation_to_regenerate(value)
        if planned is None:
            return [await self.process(key, value, before, defer)]
        outputs: list[Output] = []
        generate = functools.partial(self._generate, before=before, defer=defer)
        for outcome in await regen.regenerate_turns(*planned, generate):
            if isinstance(outcome, regen.TurnFailure):
                payload, pid = outcome.payload.encode(), outcome.prompt_id
                outputs.append(self.dead_letter(outcome.kind, outcome.message, payload, pid))
                continue
            self._completed(outcome)
            outputs.append(Completion(outcome.prompt_id.encode(), outcome.encode()))
        return outputs

    async def process(
        self,
        key: bytes | None,
        value: bytes,
        before: BeforeRequest | None = None,
        defer: bool = False,
    ) -> Output:
        """One prompt's completion, or its dead letter."""
        try:
            prompt = PromptRecord.decode(value)
            # the tools too: a prompt the server cannot take is a dead letter before a request
            validate_prompt_messages(prompt.messages, prompt.tools)
        except RecordError as err:
            return self.dead_letter(err.kind, err.message, value, _prompt_id(key))
        try:
            completion = await self._generate(prompt, before, defer)
        except GenerationError as err:
            return self.dead_letter(err.kind, err.message, value, prompt.prompt_id)
        self._completed(completion)
        return Completion(prompt.prompt_id.encode(), completion.encode())

    def _completed(self, completion: CompletionRecord) -> None:
        self.stats.completed += 1
        self.stats.output_tokens += int(completion.usage.get("completion_tokens") or 0)

    async def _generate(
        self, prompt: PromptRecord, before: BeforeRequest | None = None, defer: bool = False
    ) -> CompletionRecord:
        attempts = 0
        while True:
            await self.gate.wait_open()
            if before is not None:
                await before()
            try:
                return await self.client.complete(prompt)
            except GenerationError as err:
                self.stats.errors[err.kind] = self.stats.errors.get(err.kind, 0) + 1
                if err.auth:
                    # The key, not the prompt: pause the whole worker, spend nothing of the prompt.
                    await self.gate.pause(AUTH)
                    continue
                if not err.transient:
                    if defer:
                        raise Refused(err) from None
                    raise
                problem = await self.gate.unavailable()
                if problem is not None:
                    await self.gate.pause(problem)
                    if problem != SLOW:
                        # Down, not failing: the whole worker paused, nothing of this prompt spent.
                        continue
                # a server up but slow (a timeout on a busy one) spends an attempt: a prompt
                # that times out every time ends within `max_attempts` of them
                attempts += 1
                if attempts >= self.settings.max_attempts:
                    exhausted = GenerationError(
                        "retries_exhausted",
                        f"{err.kind} after {attempts} attempts: {err.message}",
                        transient=False,
                    )
                    raise (Refused(exhausted) if defer else exhausted) from None
                self.stats.retries += 1
                await self.backoff.sleep(attempts)

    def dead_letter(self, kind: str, message: str, raw: bytes, prompt_id: str | None) -> Letter:
        self.stats.dead_letters += 1
        return self.outbox.letter(DeadLetter.for_payload(STAGE, kind, message, raw, prompt_id))

    def _fitting(self, output: Output, raw: bytes) -> Output:
        """The output, or the prompt's dead letter for a completion over the message size
        limit: the producer would refuse it on every retry, stalling the partition. The letter
        carries the completion's prompt id (a turn's, with --regen every-turn)."""
        if not isinstance(output, Completion):
            return output
        problem = self.settings.kafka.too_large(output.key, output.value)
        if problem is None:
            return output
        self.stats.completed -= 1
        log.warning("completion of %s not sent: %s", output.prompt_id, problem)
        message = f"the completion: {problem}"
        return self.dead_letter("record_too_large", message, raw, output.prompt_id)

    async def deliver(
        self, output: Output, raw: bytes, prompt_id: str | None, keep: bool = True
    ) -> Output | None:
        """Send one output until Kafka acknowledges it; returns what was delivered (None:
        nothing). A completion refused for good (a topic whose limit is below ours) is replaced
        by the prompt's dead letter, or by nothing when `keep` is false (not ours to
        dead-letter); a dead letter is always writable (streams/core/delivery.py)."""
        if isinstance(output, Letter):
            return output if await self.outbox.send_letter(output) else None
        refused = await self.outbox.send(output)
        if refused is None:
            return output
        if not keep:
            return None
        self.stats.completed -= 1
        letter = self.dead_letter("record_too_large", refused, raw, prompt_id)
        return letter if await self.outbox.send_letter(letter) else None


def _prompt_id(key: bytes | None) -> str | None:
    return key.decode("utf-8", "replace") if key else None


__all__ = ["STAGE", "BeforeRequest", "GenerateStage", "Owned", "Refused"]
