"""A request's end, recorded as one step that a stop does not cut: its outputs delivered, then
its outcome in the ledger, then its claim released with that outcome.

A completion on the topic without its outcome in the ledger is generated again by whoever
takes the prompt next. So once a request has its answer, the steps run in a task of their own
(`record`): cancelling the request's task (Ctrl-C on `run`, SIGTERM on a worker, a rebalance)
does not cancel them, and the worker's stop waits for them (`finished`) before it closes its
producer. They are Kafka writes only: a broker outage is the one thing that makes them wait.
Only a kill -9 (or a stop that outlasts `finished`'s timeout) can still separate a completion
from its outcome.
"""

from __future__ import annotations

import asyncio
import logging

from streams.core.ledger import (
    DEAD_LETTER,
    DONE,
    Failure,
    dead_key,
    ledger_key,
    ledger_value,
)
from streams.generate.claims import Held, Work, WorkQueue
from streams.generate.outputs import Completion, LedgerMark, Letter, Output
from streams.generate.ports import Ledger
from streams.generate.stage import GenerateStage

log = logging.getLogger(__name__)


class Recorder:
    def __init__(self, stage: GenerateStage, ledger: Ledger, claims: WorkQueue, server: str):
        self.stage = stage
        self.ledger = ledger
        self.claims = claims
        self.server = server
        self._running: set[asyncio.Task[bool]] = set()
        self.stopping = False  # the worker's stop waits for the recordings (`finished`)

    async def record(
        self,
        ticket: Held,
        work: Work,
        value: bytes,
        outputs: list[Output],
        failure: Failure | None = None,
    ) -> bool:
        """Deliver, mark, release, shielded from the caller's cancellation: whether the
        prompt completed."""
        task = asyncio.ensure_future(self._record(ticket, work, value, outputs, failure))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return await asyncio.shield(task)

    async def finished(self, timeout: float) -> None:
        """Until every recording has ended, for up to `timeout` seconds."""
        self.stopping = True
        if self._running:
            log.info("recording the outcome of %d finished requests", len(self._running))
            await asyncio.wait(list(self._running), timeout=timeout)

    async def _record(
        self,
        ticket: Held,
        work: Work,
        value: bytes,
        outputs: list[Output],
        failure: Failure | None,
    ) -> bool:
        prompt_id, settings = work.prompt_id, work.settings
        outcome: str | None = None
        try:
            # a completion recorded meanwhile (a lapsed claim's late twin): no dead letter; a
            # --regenerate publish needs an outcome of its own whatever was generated before
            keep = not (
                self.claims.settled(work)
                if work.nonce
                else self.ledger.contains(prompt_id, settings)
            )
            if not keep:
                outputs = [o for o in outputs if not isinstance(o, Letter)]
            delivered = [await self.stage.deliver(o, value, prompt_id, keep) for o in outputs]
            completed = any(isinstance(o, Completion) for o in delivered)
            dead = any(isinstance(o, Letter) for o in delivered)
            record = ledger_value(prompt_id, settings, self.server)
            if completed:
                await self.stage.outbox.send(
                    LedgerMark(ledger_key(prompt_id, settings).encode(), record)
                )
                self.ledger.add(prompt_id, settings)
                outcome = DONE
            elif dead:
                await self.stage.outbox.send(
                    LedgerMark(dead_key(prompt_id, settings).encode(), record)
                )
                self.ledger.add_dead(prompt_id, settings)
                outcome = DEAD_LETTER
            return completed
        finally:
            await ticket.release(outcome, failure)
