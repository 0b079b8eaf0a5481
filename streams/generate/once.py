"""Each prompt generated once per settings: the generate stage behind the ledger.

- Before generating, it asks the ledger (streams/core/ledger.py) whether the prompt was generated
  already with its settings; if so the prompt is acked without a request. A copy of a prompt
  published while another copy is in flight here waits for it (both copies share a partition,
  since prompts are keyed by prompt_id) and is then skipped.
- After the completion is acknowledged by Kafka it writes the ledger record (same send loop,
  after the completion, so a ledger record never exists without its completion).
- Prompts stolen from other workers' backlogs (streams/generate/steal.py) go through it too:
  see the README, "Servers of unequal speed".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import orjson

from streams.core.ledger import REGENERATE, dead_key, ledger_key, ledger_value, settings_hash
from streams.core.settings import GenerateSettings
from streams.core.turns import FINAL, REGEN_MODES
from streams.generate.outputs import Completion, LedgerMark, Letter, Output
from streams.generate.ports import Ledger, ServerClient
from streams.generate.stage import GenerateStage, Owned
from streams.generate.stats import GenerateStats

log = logging.getLogger(__name__)


def prompt_mode(value: bytes) -> tuple[str, bool]:
    """(regen mode, regenerate flag) of a prompt record; a bad record gets defaults (the stage
    dead-letters it)."""
    try:
        meta = orjson.loads(value).get("meta") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return FINAL, True
    if not isinstance(meta, dict):
        return FINAL, True
    return str(meta.get("regen") or FINAL), bool(meta.get(REGENERATE))


class OnceStage:
    def __init__(
        self,
        stage: GenerateStage,
        ledger: Ledger,
        settings: GenerateSettings,
        client: ServerClient,
        stats: GenerateStats,
    ):
        self.stage = stage
        self.ledger = ledger
        self.settings = settings
        self.client = client
        self.stats = stats
        self._running: dict[str, asyncio.Future[None]] = {}

    def settings_key(self, regen: str) -> str:
        sampling = self.settings.sampling.as_dict()
        return settings_hash(self.client.model, sampling, self.settings.thinking, regen)

    def know_model(self) -> None:
        """Once the model is known: the ledger keeps only this worker's settings."""
        self.ledger.restrict({self.settings_key(mode) for mode in REGEN_MODES})

    def already_generated(self, prompt_id: str, value: bytes) -> bool:
        regen, regenerate = prompt_mode(value)
        return not regenerate and self.ledger.ended(prompt_id, self.settings_key(regen))

    async def handle(
        self, key: bytes | None, raw: bytes, owned: Owned, poisoned: str | None = None
    ) -> None:
        if poisoned is not None or not key:
            await self.stage.handle(key, raw, owned, poisoned)
            return

        async def generate_and_record() -> list[Output]:
            await self.generate_and_record(key, raw, keep_dead_letters=owned)
            return []  # already sent, in order, before the ledger learnt of the prompt

        await self.stage.guarded(key, raw, owned, generate_and_record)

    async def stolen(self, key: bytes, value: bytes) -> bool:
        """One prompt taken from another worker's backlog: true if it completed. Failures are
        dropped, not dead-lettered: the owner still has the prompt and decides."""
        try:
            completed = await self.generate_and_record(key, value, lambda: False)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("a stolen prompt failed; its owner will generate it")
            return False
        if completed:
            self.stats.stolen += 1
        return completed

    async def generate_and_record(
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
            outputs = await self.stage.outputs(key, value)
            keep = keep_dead_letters() and not self.ledger.contains(prompt_id, settings)
            if not keep:
                outputs = [o for o in outputs if not isinstance(o, Letter)]
            delivered = [await self.stage.deliver(o, value, prompt_id, keep) for o in outputs]
            completed = any(isinstance(o, Completion) for o in delivered)
            dead = any(isinstance(o, Letter) for o in delivered)
            record = ledger_value(prompt_id, settings, self.client.base_url)
            if completed:
                mark = LedgerMark(ledger_key(prompt_id, settings).encode(), record)
                await self.stage.outbox.send(mark)
                self.ledger.add(prompt_id, settings)
            elif dead:
                mark = LedgerMark(dead_key(prompt_id, settings).encode(), record)
                await self.stage.outbox.send(mark)
                self.ledger.add_dead(prompt_id, settings)
        finally:
            del self._running[prompt_id]
            done.set_result(None)
        return completed
