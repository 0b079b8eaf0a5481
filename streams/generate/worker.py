"""A generate worker: one SGLang server kept at its concurrency limit, composed of its parts.

- the gate (streams/generate/gate.py): whether requests may go to the server now;
- the slots (streams/generate/slots.py): the requests the server is kept at;
- the stage (streams/generate/stage.py): one prompt to its outputs, delivered; behind the ledger
  and its claims (streams/generate/once.py, claims.py) when the worker has one, so each prompt
  is generated once, by one worker at a time;
- the intake (streams/generate/intake.py): the in-flight window, ordered acks, revocation.

The worker starts them (asks its server for its model, version, token ids and concurrency;
a server serving another model than the run's is refused: streams/generate/identity.py),
takes prompts (`submit`), forgets revoked partitions, and is a stealer's thief
(streams/generate/steal.py). Its collaborators (the server client, the ledger, the crash guard)
are Protocols (streams/generate/ports.py): unit tests pass fakes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from streams.core.delivery import Send
from streams.core.events import Event
from streams.core.retry import Backoff, Outage, until_done
from streams.core.serving import VLLM
from streams.core.settings import GenerateSettings, generate_window
from streams.generate.exact_ids import IdsWay
from streams.generate.gate import ServerGate
from streams.generate.identity import ServedModel, refusal
from streams.generate.intake import Intake
from streams.generate.once import OnceStage
from streams.generate.outputs import Outbox, Topics
from streams.generate.ports import Ledger, PoisonCheck, ServerClient
from streams.generate.slots import Slots
from streams.generate.stage import GenerateStage
from streams.generate.stats import GenerateStats

log = logging.getLogger(__name__)

T = TypeVar("T")

# seconds a stop waits for the outcomes of finished requests to be written (Kafka writes only:
# streams/generate/record.py); `draftgen run` gives its workers 10 s in all
RECORD_S = 5.0

__all__ = ["GenerateStats", "GenerateWorker", "generate_backoff", "ids_note", "log_ids_way"]


# what a worker whose server returns no exact ids can do instead
NATIVE_HINT = "--api native --tokenizer-dir DIR gets exact ids from its /generate"


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


def generate_backoff(settings: GenerateSettings) -> Backoff:
    """Every wait-out loop of a generate worker: discovery, transient request errors, Kafka
    writes, and the app's ledger reads and partition starts (built once, in app.py)."""
    return Backoff(settings.backoff_initial_s, settings.backoff_max_s)


class WrongModel(Exception):
    """The server serves another model than the run's: the worker must not use it."""


class GenerateWorker:
    def __init__(
        self,
        settings: GenerateSettings,
        client: ServerClient,
        send: Send,
        completions_topic: str,
        dead_letters_topic: str,
        *,
        backoff: Backoff,
        ledger: Ledger | None = None,
        ledger_topic: str = "",
        guard: PoisonCheck | None = None,
        stats: GenerateStats | None = None,
        on_refused: Callable[[], None] | None = None,
    ):
        self.settings = settings
        self.client = client
        self.stats = stats if stats is not None else GenerateStats()
        self.backoff = backoff  # generate_backoff(settings)
        # probes of a down server: backing off, but never more than `health_interval_s` apart,
        # so the worker resumes soon after the server is back
        probes = Backoff(settings.backoff_initial_s, settings.health_interval_s)
        self.gate = ServerGate(client, self.stats, probes, settings.health_stall_s)
        # requests in flight; with --concurrency auto, the server's cap once start() read it
        self.slots = Slots(settings.starting_concurrency, self.gate.wait_open, self.stats)
        self.broker = Outage("broker", log)
        topics = Topics(completions_topic, dead_letters_topic, ledger_topic)
        outbox = Outbox(send, topics, settings.kafka, self.backoff, self.broker)
        self.stage = GenerateStage(
            settings, client, self.gate, outbox, self.stats, self.backoff, self.slots
        )
        self.ledger = ledger
        self.once = (
            None
            if ledger is None
            else OnceStage(self.stage, ledger, settings, client, self.stats, self.slots, self.gate)
        )
        window = generate_window(settings.starting_concurrency)
        self.intake = Intake(self.once or self.stage, window, self.stats, guard)
        self._starting: asyncio.Task[None] | None = None
        self._watching: asyncio.Task[None] | None = None
        # why the server was refused at start (`WrongModel`); then `on_refused` (the app stops),
        # else it is logged
        self.refused: str | None = None
        self.on_refused = on_refused

    @property
    def concurrency(self) -> int:
        return self.slots.concurrency

    @property
    def server(self) -> Outage:
        return self.gate.outage

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self.ledger is None:
            await self._start_server()
            return
        # the ledger is read while the server is asked; a prompt waits for both anyway
        await asyncio.gather(self.ledger.start(), self._start_server())

    async def _start_server(self) -> None:
        """Wait for the server to answer, learn its model, then let the intake take prompts;
        a server that serves another model than the run's raises WrongModel."""
        url = self.client.base_url
        await self._ask(f"asking {url} for its model", self.client.discover)
        normalization = await self._ask(
            f"asking {url} for its version", self.client.use_server_version
        )
        log.info(
            "server %s reports %s %s: prompts render as %s preprocesses them%s",
            url,
            "vLLM" if self.client.server_kind == VLLM else "SGLang",
            self.client.server_version or "(no version)",
            normalization.name,
            " (forced by --normalization)" if self.settings.normalization else "",
        )
        # one model per run: another model's answers would mix in, claimed apart from the run's
        said = self.client.identity
        served = ServedModel.of(self.client.model, said.revision, said.tokenizer)
        self.refused = refusal(url, ServedModel.expected(self.settings), served)
        if self.refused is not None:
            raise WrongModel(self.refused)
        way = await self._ask(f"asking {url} for token ids", self.client.probe_ids)
        log_ids_way(url, way)
        self.stats.exact_ids = ids_note(way)
        if self.settings.concurrency == "auto":
            what = f"asking {url} for its max_running_requests"
            self._use_concurrency(await self._ask(what, self.client.max_running_requests))
        log.info(
            "generating with model %s (%s family) on %s, %d in flight",
            self.client.model,
            self.client.family.name,
            url,
            self.concurrency,
        )
        self.gate.open()
        # a server that stops answering while requests run holds the gate (hung: closes it)
        self._watching = asyncio.create_task(
            self.gate.watch(self.settings.health_watch_s, self.slots.busy)
        )
        self.intake.ready.set()

    async def _ask(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        return await until_done(
            what, self.gate.authorized(call), self.backoff, log, self.gate.outage
        )

    def _use_concurrency(self, cap: int | None) -> None:
        if cap is None:
            log.warning(
                "server %s does not say its max_running_requests; keeping %d in flight "
                "(--concurrency N sets it)",
                self.client.base_url,
                self.concurrency,
            )
            return
        # nothing holds a slot yet, nor is in the window: submit() waits for `ready`
        self.slots.resize(cap)
        self.intake.resize(generate_window(cap))

    def start_soon(self) -> None:
        """`start()` in the background, once: the agent calls it as it starts, so the server is
        asked while the consumer joins its group, not after (Faust starts app tasks only then)."""
        if self._starting is None:
            self._starting = asyncio.create_task(self.start())
            self._starting.add_done_callback(self._failed_start)

    def _failed_start(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or (err := task.exception()) is None:
            return
        if isinstance(err, WrongModel):  # one line, no traceback: the operator's to fix
            if self.on_refused is not None:
                self.on_refused()
            else:
                log.error("%s", err)
        else:
            log.error("the generate worker failed to start", exc_info=err)

    def starting(self) -> asyncio.Task[None] | None:
        return self._starting

    async def ready(self) -> None:
        """Started: the server answered and prompts are taken."""
        await self.intake.ready.wait()

    async def stop(self) -> None:
        for task in (self._starting, self._watching):
            if task:
                task.cancel()
        self.intake.stop()
        if self.once is not None:
            await self.once.recorded(RECORD_S)
            self.once.stop()
        self.gate.close()
        await self.client.close()
        if self.ledger is not None:
            await self.ledger.stop()

    # -- the agent's ----------------------------------------------------------------------

    async def submit(self, event: Event) -> None:
        """Take one prompt: waits for a free slot and a healthy server, then starts it."""
        await self.intake.submit(event)

    async def revoke_partitions(self, partitions: Iterable[Any]) -> None:
        """Revoked (or not given back): prompts not requesting are dropped, requests go on."""
        await self.intake.revoke(partitions)

    async def finish_requests(self, seconds: float) -> None:
        """SIGTERM: wait up to `seconds` for the requests running here to end, then release
        their claims (streams/generate/once.py)."""
        if self.once is not None:
            await self.once.finish_requests(seconds)

    # -- a stealer's thief (streams/generate/steal.py) ----------------------------------------

    @property
    def last_busy(self) -> float:
        return self.slots.last_busy

    async def ready_to_steal(self) -> None:
        await self.ready()
        if self.ledger is not None:
            await self.ledger.caught_up.wait()

    async def wait_idle(self, seconds: float) -> None:
        """Idle for `seconds` with the server healthy: a worker whose server is down takes
        nothing of others."""
        await self.gate.wait_open()
        await self.slots.wait_idle(seconds)
        await self.gate.wait_open()

    def free_slots(self) -> int:
        return self.slots.free()

    def settled(self, prompt_id: str, value: bytes) -> bool:
        once = self.once
        return once is not None and once.claims.settled(once.work_of(prompt_id.encode(), value))

    def spoken_for(self, prompt_id: str, value: bytes) -> bool:
        return self.once is not None and self.once.spoken_for(prompt_id, value)

    def start_stolen(self, records: list[tuple[bytes, bytes]]) -> list[asyncio.Task[bool]]:
        """Start generating prompts taken from another worker's backlog, each in a slot of its
        own once it gets one; their tasks, each true if its prompt completed here. Never
        acked: the owner acks them once their outcomes are in the ledger."""
        once = self.once
        if once is None:
            raise RuntimeError("stealing needs the ledger")
        jobs: list[Callable[[], Awaitable[bool]]] = [
            functools.partial(once.stolen, key, value) for key, value in records
        ]
        return self.intake.start_extra(jobs)

    async def run_stolen(self, records: list[tuple[bytes, bytes]]) -> int:
        """`start_stolen`, then wait for them; returns how many completed."""
        return sum(await asyncio.gather(*self.start_stolen(records)))
