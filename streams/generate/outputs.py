"""What the generate stage writes, as types, and the one place that sends them to their topics.

A prompt ends as `Completion`s (one, or one per turn with `--regen every-turn`) or a `Letter`;
a worker with a ledger then writes a `LedgerMark`. Each type knows its topic through `Topics`,
so no caller tells outputs apart by topic names.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from streams.core.delivery import Send, letter_output, send_dead_letter, send_until_acked
from streams.core.records import DeadLetter
from streams.core.retry import Backoff, Outage
from streams.core.settings import KafkaSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completion:
    key: bytes  # the prompt_id (a turn's, with --regen every-turn)
    value: bytes

    @property
    def prompt_id(self) -> str:
        return self.key.decode("utf-8", "replace")


@dataclass(frozen=True)
class Letter:
    """A dead letter, encoded within the producers' size limit (`letter_output`)."""

    key: bytes
    value: bytes


@dataclass(frozen=True)
class LedgerMark:
    """A prompt's outcome in the ledger (streams/core/ledger.py): written after the outcome."""

    key: bytes
    value: bytes


Output = Completion | Letter


@dataclass(frozen=True)
class Topics:
    completions: str
    dead_letters: str
    ledger: str = ""


class Outbox:
    """Sends outputs until Kafka acknowledges them: a broker outage is waited out (`broker`
    says when it goes and comes back), never a reason to lose a generation."""

    def __init__(
        self, send: Send, topics: Topics, kafka: KafkaSettings, backoff: Backoff, broker: Outage
    ):
        self._send = send
        self.topics = topics
        self.kafka = kafka
        self.backoff = backoff
        self.broker = broker

    def letter(self, letter: DeadLetter) -> Letter:
        _, key, value = letter_output(self.kafka, self.topics.dead_letters, letter)
        return Letter(key, value)

    async def send(self, output: Completion | LedgerMark) -> str | None:
        """Until acked; a write refused for good is never retried: returns why (else None)."""
        topic = self.topics.completions if isinstance(output, Completion) else self.topics.ledger
        return await send_until_acked(
            self._send, topic, output.key, output.value, self.backoff, log, self.broker
        )

    async def send_letter(self, letter: Letter) -> bool:
        """A dead letter is always writable, if need be without its payload (False: dropped,
        logged)."""
        output = (self.topics.dead_letters, letter.key, letter.value)
        return await send_dead_letter(self._send, output, self.backoff, log, self.broker)
