"""A generate worker that generates each prompt once per settings, and may steal work.

- Before generating, it asks the ledger (streams/core/ledger.py) whether the prompt was generated
  already with its settings; if so the prompt is acked without a request. A copy of a prompt
  published while another copy is in flight here waits for it (both copies share a partition,
  since prompts are keyed by prompt_id) and is then skipped.
- After the completion is acknowledged by Kafka it writes the ledger record (same send loop,
  after the completion, so a ledger record never exists without its completion).
- With `steal_after_s` > 0 an idle worker takes over prompts from the tail of other workers'
  backlogs (streams/generate/steal.py): see the README, "Servers of unequal speed".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import orjson

from streams.core.delivery import Send
from streams.core.faust_app import Event
from streams.core.ledger import (
    REGENERATE,
    LedgerFollower,
    dead_key,
    ledger_key,
    ledger_value,
    settings_hash,
)
from streams.core.settings import GenerateSettings, OnceSettings
from streams.core.turns import FINAL
from streams.generate.client import SGLangClient
from streams.generate.worker import GenerateWorker

log = logging.getLogger(__name__)

Output = tuple[str, bytes, bytes]


def prompt_mode(value: bytes) -> tuple[str, bool]:
    """(regen mode, regenerate flag) of a prompt record; a bad record gets defaults (the base
    worker dead-letters it)."""
    try:
        meta = orjson.loads(value).get("meta") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return FINAL, True
    if not isinstance(meta, dict):
        return FINAL, True
    return str(meta.get("regen") or FINAL), bool(meta.get(REGENERATE))


class OnceGenerateWorker(GenerateWorker):
    def __init__(
        self,
        settings: GenerateSettings,
        client: SGLangClient,
        send: Send,
        completions_topic: str,
        dead_letters_topic: str,
        ledger_topic: str,
        once: OnceSettings,
    ):
        super().__init__(settings, client, send, completions_topic, dead_letters_topic)
        self.once = once
        self.ledger_topic = ledger_topic
        self.ledger = LedgerFollower(settings.kafka, backoff=self.backoff)
        self.last_busy = time.monotonic()
        self._running: dict[str, asyncio.Future[None]] = {}
        self._stolen_tasks: set[asyncio.Task[bool]] = set()

    async def start(self) -> None:
        if not self.once.ledger:
            await super().start()
            return
        # the ledger is read while the server is asked; a prompt waits for both anyway
        await asyncio.gather(self.ledger.start(), super().start())

    async def stop(self) -> None:
        for task in list(self._stolen_tasks):
            task.cancel()
        await super().stop()
        await self.ledger.stop()

    async def submit(self, event: Event) -> None:
        self.last_busy = time.monotonic()
        await super().submit(event)
        self.last_busy = time.monotonic()

    def settings_key(self, regen: str) -> str:
        sampling = self.settings.sampling.as_dict()
        return settings_hash(self.client.model, sampling, self.settings.thinking, regen)

    def already_generated(self, prompt_id: str, value: bytes) -> bool:
        regen, regenerate = prompt_mode(value)
        return not regenerate and self.ledger.ended(prompt_id, self.settings_key(regen))

    async def process_all(
        self, key: bytes | None, value: bytes, owned: Callable[[], bool] = lambda: True
    ) -> list[Output]:
        if not self.once.ledger or not key:
            return await super().process_all(key, value, owned)
        await self._generate_and_record(key, value, keep_dead_letters=owned)
        return []  # already sent, in order, before the ledger learnt of the prompt

    async def _generate_and_record(
        self, key: bytes, value: bytes, keep_dead_letters: Callable[[], bool]
    ) -> bool:
        """Generate unless the ledger has its outcome; send the outputs, then record it. The
        ledger (and this process's view of it) learns of a prompt only once its completion or
        dead letter is acknowledged by Kafka, so a copy skipped because of it can never be the
        prompt's last chance. Exactly one outcome: a prompt the ledger says ended (completed or
        dead-lettered) is not done again (a redelivery after a crash); a dead letter is dropped
        when the prompt is no longer ours (`keep_dead_letters()` false: revoked, or stolen) or
        when a completion of it was recorded meanwhile (by the worker it moved from)."""
        await self.ledger.caught_up.wait()
        prompt_id = key.decode("utf-8", "replace")
        regen, regenerate = prompt_mode(value)
        settings = self.settings_key(regen)
        # a copy of this prompt is in flight here: let it finish, then ask the ledger
        while (running := self._running.get(prompt_id)) is not None:
            await asyncio.shield(running)
        if not regenerate and self.ledger.ended(prompt_id, settings):
            self.stats.skipped += 1
            return False
        done = asyncio.get_running_loop().create_future()
        self._running[prompt_id] = done
        try:
            outputs = await super().process_all(key, value)
            keep = keep_dead_letters() and not self.ledger.contains(prompt_id, settings)
            if not keep:
                outputs = [o for o in outputs if o[0] != self.dead_letters_topic]
            delivered = [await self._deliver(o, value, prompt_id, keep) for o in outputs]
            completed = any(o and o[0] == self.completions_topic for o in delivered)
            dead = any(o and o[0] == self.dead_letters_topic for o in delivered)
            record = ledger_value(prompt_id, settings, self.client.base_url)
            if completed:
                ledger = (self.ledger_topic, ledger_key(prompt_id, settings).encode(), record)
                await self._send_until_acked(*ledger)
            elif dead:
                ledger = (self.ledger_topic, dead_key(prompt_id, settings).encode(), record)
                await self._send_until_acked(*ledger)
            if completed:
                self.ledger.add(prompt_id, settings)
            elif dead:
                self.ledger.add_dead(prompt_id, settings)
        finally:
            del self._running[prompt_id]
            done.set_result(None)
        return completed

    async def start_stolen(self, records: list[tuple[bytes, bytes]]) -> list[asyncio.Task[bool]]:
        """Start generating prompts taken from another worker's backlog, each once it has a
        slot of this worker's (a caller that asks for no more than `free_slots()` does not
        wait); returns their tasks, each true if its prompt completed. Failures are dropped,
        not dead-lettered: the owner still has the prompt and decides."""
        await self._server_up.wait()
        tasks = []
        for key, value in records:
            await self._slots.acquire()
            self._started_one()
            task = asyncio.create_task(self._stolen_one(key, value))
            self._stolen_tasks.add(task)
            task.add_done_callback(self._stolen_done)
            tasks.append(task)
        return tasks

    async def run_stolen(self, records: list[tuple[bytes, bytes]]) -> int:
        """`start_stolen`, then wait for them; returns how many completed."""
        return sum(await asyncio.gather(*await self.start_stolen(records)))

    async def _stolen_one(self, key: bytes, value: bytes) -> bool:
        """One stolen prompt, in a slot already taken for it."""
        try:
            return await self._generate_and_record(key, value, keep_dead_letters=lambda: False)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("a stolen prompt failed; its owner will generate it")
            return False
        finally:
            self._finished_one()
            self._slots.release()

    def _stolen_done(self, task: asyncio.Task[bool]) -> None:
        self._stolen_tasks.discard(task)
        if not task.cancelled() and task.exception() is None and task.result():
            self.stats.stolen += 1

    def free_slots(self) -> int:
        # every request holds a slot (own or stolen) from _started_one to _finished_one
        return max(0, self.concurrency - self.stats.in_flight)

    def idle_for(self) -> float:
        """Seconds this worker has had a free slot and no prompt of its own to put in it (0
        while every slot is taken, or a prompt of its own waits for one). Its requests still
        running do not count: at the end of a run they finish one by one, and each slot they
        free can take someone else's prompt at once."""
        if self._slots.locked():
            return 0.0
        return time.monotonic() - self.last_busy

    async def wait_idle(self, seconds: float) -> None:
        """Return once the worker has had a free slot and no prompt of its own for `seconds`:
        awaits a free slot, then a timer to the moment it will have been idle long enough."""
        while (remaining := seconds - self.idle_for()) > 0:
            if self._slots.locked():
                await self._slots.acquire()  # the next slot freed
                self._slots.release()
            else:
                await asyncio.sleep(remaining)
