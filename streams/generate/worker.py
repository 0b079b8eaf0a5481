"""The generate stage: keeps `concurrency` requests in flight against one SGLang server.

A prompt's offset is acked (and so committed) only after its completion, or its dead letter,
has been acknowledged by Kafka, and only in offset order (see streams/generate/inflight.py).
Any exception while handling one prompt becomes that prompt's dead letter, never a crash. A
prompt whose partition was revoked while it was in flight gets no dead letter from here: its
new owner redoes it and decides (a completion is still sent: the tokenize stage keeps one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from streams.core.crash_guard import CRASH_LOOP, CrashGuard
from streams.core.delivery import Send, letter_output, send_dead_letter, send_until_acked
from streams.core.faust_app import Event
from streams.core.normalize import validate_prompt_messages
from streams.core.records import CompletionRecord, DeadLetter, PromptRecord, RecordError
from streams.core.retry import Backoff, Outage, until_done
from streams.core.settings import DEFAULT_CONCURRENCY, GenerateSettings
from streams.generate import regen
from streams.generate.client import AUTH, DOWN, GenerationError, SGLangClient
from streams.generate.exact_ids import IdsWay
from streams.generate.inflight import InFlightWindow

log = logging.getLogger(__name__)

STAGE = "generate"

T = TypeVar("T")


@dataclass
class GenerateStats:
    in_flight: int = 0
    completed: int = 0
    dead_letters: int = 0
    retries: int = 0
    output_tokens: int = 0
    paused: bool = False
    # why: DOWN (the server does not answer) or AUTH (it refuses the API key); "" when running
    paused_for: str = ""
    # prompts acked without a request, because the ledger had them (streams/generate/once.py)
    skipped: int = 0
    # prompts generated from other workers' backlogs (streams/generate/steal.py)
    stolen: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    # how its server returns exact token ids, once asked (`ids_note`); "" before
    exact_ids: str = ""


# what a worker whose server returns no exact ids can do instead
NATIVE_HINT = "--api native --tokenizer DIR gets exact ids from its /generate"


def ids_note(way: IdsWay | None) -> str:
    """The ids way in a few words, for heartbeats (`status`, `run`'s console)."""
    if way is None:
        return ""
    if way.exact:
        return f"exact via {' + '.join(way.fields)} ({way.name})"
    if way.fields:
        return f"prompt ids only ({' + '.join(way.fields)}): samples rendered"
    return "none: samples rendered"


def log_ids_way(server: str, way: IdsWay | None) -> None:
    if way is None:
        return  # the probe was refused: the client said so
    where = " + ".join(way.fields)
    if way.exact:
        log.info("server %s returns exact token ids via %s (%s)", server, where, way.name)
    elif way.fields:
        log.warning(
            "server %s returns only prompt token ids (%s): samples will be rendered, not "
            "token-exact from the server (%s)",
            server,
            where,
            NATIVE_HINT,
        )
    else:
        log.warning(
            "server %s returns no token ids: samples will be rendered, not token-exact from "
            "the server (%s)",
            server,
            NATIVE_HINT,
        )


def pause_line(server: str, reason: str) -> str:
    """The one line a pause gets: what is wrong and what to fix (never the key itself)."""
    if reason == AUTH:
        return (
            f"server {server} refuses the API key (HTTP 401/403); pausing until it accepts "
            "it: set DRAFTGEN_API_KEY (or OPENAI_API_KEY) to the server's --api-key"
        )
    return f"server {server} is down; pausing until it is healthy"


def _report_failed_start(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the generate worker failed to start", exc_info=task.exception())


class GenerateWorker:
    def __init__(
        self,
        settings: GenerateSettings,
        client: SGLangClient,
        send: Send,
        completions_topic: str,
        dead_letters_topic: str,
        guard: CrashGuard | None = None,
    ):
        self.guard = guard
        self.settings = settings
        self.client = client
        self.send = send
        self.completions_topic = completions_topic
        self.dead_letters_topic = dead_letters_topic
        self.stats = GenerateStats()
        self.window: InFlightWindow[Event] = InFlightWindow()
        # every wait-out loop of the worker: discovery, transient request errors, Kafka writes
        self.backoff = Backoff(settings.backoff_initial_s, settings.backoff_max_s)
        # probes of a down server: backing off, but never more than `health_interval_s` apart,
        # so the worker resumes soon after the server is back
        self._probe_backoff = Backoff(settings.backoff_initial_s, settings.health_interval_s)
        # what this worker knows of its dependencies: one line when one goes, one when it is back
        self.broker = Outage("broker", log)
        self.server = Outage(f"server {client.base_url}", log)
        # requests in flight; with --concurrency auto, the server's cap once start() read it
        fixed = settings.concurrency
        self.concurrency = fixed if isinstance(fixed, int) else DEFAULT_CONCURRENCY
        self._slots = asyncio.Semaphore(self.concurrency)
        self._server_up = asyncio.Event()
        self._ready = asyncio.Event()
        self._prober: asyncio.Task[None] | None = None
        self._starting: asyncio.Task[None] | None = None
        self._down_since = 0.0
        self._tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Wait for the server to answer, learn its model, then let the agent take prompts."""
        what = f"asking {self.client.base_url} for its model"
        await until_done(
            what, self._authorized(self.client.discover), self.backoff, log, self.server
        )
        what = f"asking {self.client.base_url} for its version"
        normalization = await until_done(
            what, self._authorized(self.client.use_server_version), self.backoff, log, self.server
        )
        log.info(
            "server %s reports SGLang %s: prompts render as %s preprocesses them%s",
            self.client.base_url,
            self.client.server_version or "(no version)",
            normalization.name,
            " (forced by --normalization)" if self.settings.normalization else "",
        )
        what = f"asking {self.client.base_url} for token ids"
        way = await until_done(
            what, self._authorized(self.client.probe_ids), self.backoff, log, self.server
        )
        log_ids_way(self.client.base_url, way)
        self.stats.exact_ids = ids_note(way)
        if self.settings.concurrency == "auto":
            what = f"asking {self.client.base_url} for its max_running_requests"
            cap = await until_done(
                what,
                self._authorized(self.client.max_running_requests),
                self.backoff,
                log,
                self.server,
            )
            self._use_concurrency(cap)
        log.info(
            "generating with model %s (%s family) on %s, %d in flight",
            self.client.model,
            self.client.family.name,
            self.client.base_url,
            self.concurrency,
        )
        self._server_up.set()
        self._ready.set()

    def _authorized(self, call: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
        """`call`, except that a refused API key pauses (one line, as for requests) until the
        server accepts it, then calls again: at start too the key is the operator's to fix,
        not a server "unreachable"."""

        async def attempt() -> T:
            while True:
                try:
                    return await call()
                except GenerationError as err:
                    if not err.auth:
                        raise
                await self._wait_for_server(AUTH)

        return attempt

    def _use_concurrency(self, cap: int | None) -> None:
        if cap is None:
            log.warning(
                "server %s does not say its max_running_requests; keeping %d in flight "
                "(--concurrency N sets it)",
                self.client.base_url,
                self.concurrency,
            )
            return
        self.concurrency = cap
        # nothing holds a slot yet: submit() waits for _ready, which is set after this
        self._slots = asyncio.Semaphore(cap)

    def start_soon(self) -> None:
        """`start()` in the background, once: the agent calls it as it starts, so the server is
        asked while the consumer joins its group, not after (Faust starts app tasks only then)."""
        if self._starting is None:
            self._starting = asyncio.create_task(self.start())
            self._starting.add_done_callback(_report_failed_start)

    async def stop(self) -> None:
        if self._starting:
            self._starting.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self._prober:
            self._prober.cancel()
        await self.client.close()

    # -- the agent loop ----------------------------------------------------------------------

    async def submit(self, event: Event) -> None:
        """Take one prompt: waits for a free slot and a healthy server, then starts it."""
        await self._ready.wait()
        await self._slots.acquire()
        await self._server_up.wait()
        message = event.message
        poisoned = None
        if self.guard is not None:
            poisoned = self.guard.poisoned(message.tp.topic, message.tp.partition, message.offset)
        self.window.add(message.tp, message.offset, event)
        self._started_one()
        task = asyncio.create_task(self._run_one(event, poisoned))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget_partitions(self, partitions: Any) -> None:
        dropped = self.window.forget(partitions)
        if dropped:
            log.info(
                "partitions revoked with %d prompts in flight; their new owner redoes them", dropped
            )

    async def _run_one(self, event: Event, poisoned: str | None = None) -> None:
        message = event.message

        def owned() -> bool:
            return self.window.holds(message.tp, message.offset)

        raw = bytes(event.value)
        prompt_id = bytes(event.key).decode("utf-8", "replace") if event.key else None
        try:
            if poisoned is not None:  # it crashed this worker twice: its dead letter, no retry
                outputs = [self._dead_letter(CRASH_LOOP, poisoned, raw, prompt_id)]
            else:
                outputs = await self.process_all(event.key, raw, owned)
            for output in outputs:
                if output[0] == self.dead_letters_topic and not owned():
                    continue  # revoked meanwhile: the new owner decides this prompt's outcome
                await self._deliver(output, raw, prompt_id, owned())
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a bug, not bad input: dead-letter it so the partition moves on
            log.exception("unexpected failure on a prompt; sending it to dead letters")
            if owned():
                letter = self._dead_letter(
                    "internal_error", f"{type(err).__name__}: {err}", raw, prompt_id
                )
                await self._send_letter(letter)
        self._finished_one()
        self._slots.release()
        message = event.message
        for releasable in self.window.finish(message.tp, message.offset):
            releasable.ack()

    def _started_one(self) -> None:
        self.stats.in_flight += 1

    def _finished_one(self) -> None:
        self.stats.in_flight -= 1

    # -- one prompt --------------------------------------------------------------------------

    async def process_all(
        self, key: bytes | None, value: bytes, owned: Callable[[], bool] = lambda: True
    ) -> list[tuple[str, bytes, bytes]]:
        """Every output of one prompt: one, or one per turn for `--regen every-turn`, for the
        caller to send; `owned()` says whether the prompt is still this worker's."""
        return [self._fitting(output, value) for output in await self._outputs(key, value)]

    async def _outputs(self, key: bytes | None, value: bytes) -> list[tuple[str, bytes, bytes]]:
        planned = regen.conversation_to_regenerate(value)
        if planned is None:
            return [await self.process(key, value)]
        outputs = []
        for outcome in await regen.regenerate_turns(*planned, self._generate):
            if isinstance(outcome, regen.TurnFailure):
                payload, pid = outcome.payload.encode(), outcome.prompt_id
                outputs.append(self._dead_letter(outcome.kind, outcome.message, payload, pid))
                continue
            self.stats.completed += 1
            self.stats.output_tokens += int(outcome.usage.get("completion_tokens") or 0)
            outputs.append((self.completions_topic, outcome.prompt_id.encode(), outcome.encode()))
        return outputs

    async def process(self, key: bytes | None, value: bytes) -> tuple[str, bytes, bytes]:
        """Turn one prompt into (topic, key, value) for a completion or a dead letter."""
        prompt_id = key.decode("utf-8", "replace") if key else None
        try:
            prompt = PromptRecord.decode(value)
            # the tools too: a prompt the server cannot take is a dead letter before a request
            validate_prompt_messages(prompt.messages, prompt.tools)
        except RecordError as err:
            return self._dead_letter(err.kind, err.message, value, prompt_id)
        try:
            completion = await self._generate(prompt)
        except GenerationError as err:
            return self._dead_letter(err.kind, err.message, value, prompt.prompt_id)
        self.stats.completed += 1
        self.stats.output_tokens += int(completion.usage.get("completion_tokens") or 0)
        return self.completions_topic, prompt.prompt_id.encode(), completion.encode()

    async def _generate(self, prompt: PromptRecord) -> CompletionRecord:
        attempts = 0
        while True:
            await self._server_up.wait()
            try:
                return await self.client.complete(prompt)
            except GenerationError as err:
                self.stats.errors[err.kind] = self.stats.errors.get(err.kind, 0) + 1
                if err.auth:
                    # The key, not the prompt: pause the whole worker, spend nothing of the prompt.
                    await self._wait_for_server(AUTH)
                    continue
                if not err.transient:
                    raise
                problem = await self._unavailable()
                if problem is not None:
                    # Down, not failing: pause the whole worker, don't spend this prompt's budget.
                    await self._wait_for_server(problem)
                    continue
                attempts += 1
                if attempts >= self.settings.max_attempts:
                    raise GenerationError(
                        "retries_exhausted",
                        f"{err.kind} after {attempts} attempts: {err.message}",
                        transient=False,
                    ) from None
                self.stats.retries += 1
                await self.backoff.sleep(attempts)

    async def _wait_for_server(self, reason: str = DOWN) -> None:
        """Pause every request until the server is healthy again and accepts the API key. One
        task probes the server; everyone else only awaits the `_server_up` event it sets."""
        if self._prober is None or self._prober.done():
            self._server_up.clear()
            self._pause_for(reason)
            self._down_since = time.monotonic()
            self._prober = asyncio.create_task(self._probe_until_healthy())
        await self._server_up.wait()

    def _pause_for(self, reason: str) -> None:
        """One line per pause and per change of its reason (down, then a refused key)."""
        if self.stats.paused_for != reason:
            log.warning("%s", pause_line(self.client.base_url, reason))
        self.stats.paused = True
        self.stats.paused_for = reason

    async def _probe_until_healthy(self) -> None:
        attempt = 0
        while (problem := await self._unavailable()) is not None:
            self._pause_for(problem)
            attempt += 1
            await self._probe_backoff.sleep(attempt)
        log.warning(
            "server %s is healthy again%s; resuming after %.0f s %s",
            self.client.base_url,
            " and accepts the API key" if self.stats.paused_for == AUTH else "",
            time.monotonic() - self._down_since,
            "paused" if self.stats.paused_for == AUTH else "down",
        )
        self.stats.paused = False
        self.stats.paused_for = ""
        self._server_up.set()

    async def _unavailable(self) -> str | None:
        try:
            return await self.client.unavailable()
        except asyncio.CancelledError:
            raise
        except Exception:  # a probe that fails is an answer: not healthy yet
            return DOWN

    def _dead_letter(
        self, kind: str, message: str, raw: bytes, prompt_id: str | None
    ) -> tuple[str, bytes, bytes]:
        self.stats.dead_letters += 1
        letter = DeadLetter.for_payload(STAGE, kind, message, raw, prompt_id)
        return letter_output(self.settings.kafka, self.dead_letters_topic, letter)

    def _fitting(self, output: tuple[str, bytes, bytes], raw: bytes) -> tuple[str, bytes, bytes]:
        """The output, or the prompt's dead letter for a completion over the message size
        limit: the producer would refuse it on every retry, stalling the partition. The letter
        carries the completion's prompt id (a turn's, with --regen every-turn)."""
        topic, key, value = output
        problem = self.settings.kafka.too_large(key, value)
        if topic != self.completions_topic or problem is None:
            return output
        self.stats.completed -= 1
        prompt_id = key.decode("utf-8", "replace")
        log.warning("completion of %s not sent: %s", prompt_id, problem)
        return self._dead_letter("record_too_large", f"the completion: {problem}", raw, prompt_id)

    async def _deliver(
        self, output: tuple[str, bytes, bytes], raw: bytes, prompt_id: str | None, keep: bool
    ) -> tuple[str, bytes, bytes] | None:
        """Send one output until Kafka acknowledges it; returns what was delivered (None:
        nothing). A completion refused for good (a topic whose limit is below ours) is replaced
        by the prompt's dead letter, or by nothing when `keep` is false (not ours to
        dead-letter); a dead letter is always writable (streams/core/delivery.py)."""
        if output[0] == self.dead_letters_topic:
            return output if await self._send_letter(output) else None
        refused = await self._send_until_acked(*output)
        if refused is None:
            return output
        if output[0] != self.completions_topic or not keep:
            return None
        self.stats.completed -= 1
        letter = self._dead_letter("record_too_large", refused, raw, prompt_id)
        return letter if await self._send_letter(letter) else None

    async def _send_until_acked(self, topic: str, key: bytes, value: bytes) -> str | None:
        """Kafka down is an outage to wait out, not a reason to lose the generation. A write
        refused for good is never retried: returns why (else None)."""
        return await send_until_acked(self.send, topic, key, value, self.backoff, log, self.broker)

    async def _send_letter(self, letter: tuple[str, bytes, bytes]) -> bool:
        return await send_dead_letter(self.send, letter, self.backoff, log, self.broker)
