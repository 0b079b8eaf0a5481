"""Writing to Kafka until acknowledged, and dead letters that can always be written.

An outage (the broker down, a leader moving) is waited out, never a reason to lose a record.
A write that Kafka refuses for good (too large, an invalid record) is not retried: no retry
would pass it, and retrying would stall the partition behind it. A dead letter is cut to the
producers' size limit before it is sent (`DeadLetter.encode_within`); if Kafka still refuses it (a
topic created with a lower limit than ours) it goes once more without its payload (its size,
SHA-256 and origin still say what it was), and if that too is refused it is logged and dropped:
one bad record never stops the stage.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiokafka.errors import (
    CorruptRecordException,
    InvalidMessageError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)

from streams.core.outage import Outage, short_error
from streams.core.records import DeadLetter
from streams.core.retry import Backoff, until_done
from streams.core.settings import KafkaSettings

# (topic name, key, value) -> resolves once Kafka acknowledged the write
Send = Callable[[str, bytes, bytes], Awaitable[None]]

# refusals of the record itself: the same bytes fail the same way on every retry
_FOR_GOOD = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    CorruptRecordException,
    InvalidMessageError,
)


def refused_for_good(err: BaseException) -> bool:
    """Whether a failed send was refused for the record itself (its size, by the producer or
    by a topic whose max.message.bytes is lower than ours; an invalid record). faust wraps the
    error, so the whole cause chain is looked at."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, _FOR_GOOD):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def send_until_acked(
    send: Send,
    topic: str,
    key: bytes,
    value: bytes,
    backoff: Backoff,
    log: logging.Logger,
    outage: Outage | None = None,
) -> str | None:
    """Send until Kafka acknowledges; returns why a write was refused for good (else None)."""

    async def attempt() -> str | None:
        try:
            await send(topic, key, value)
        except Exception as err:
            if not refused_for_good(err):
                raise  # transient: until_done waits it out
            log.warning("a %d-byte write to %s refused: %s", len(value), topic, short_error(err))
            return f"a {len(value)}-byte message refused by Kafka: {short_error(err)}"
        return None

    return await until_done(f"writing to {topic}", attempt, backoff, log, outage)


def letter_output(kafka: KafkaSettings, topic: str, letter: DeadLetter) -> tuple[str, bytes, bytes]:
    """(topic, key, value) of a dead letter, cut to what the producers accept."""
    key = (letter.prompt_id or "").encode()
    return topic, key, letter.encode_within(kafka.value_budget(key))


async def send_dead_letter(
    send: Send,
    output: tuple[str, bytes, bytes],
    backoff: Backoff,
    log: logging.Logger,
    outage: Outage | None = None,
) -> bool:
    """Send a dead letter's (topic, key, value) (`letter_output`); if refused for good, once
    more without its payload; False (logged) if that is refused too."""
    topic, key, value = output
    refused = await send_until_acked(send, topic, key, value, backoff, log, outage)
    if refused is None:
        return True
    bare = DeadLetter.decode(value)
    refused = await send_until_acked(send, topic, key, bare.encode_within(0), backoff, log, outage)
    if refused is None:
        log.warning("dead letter of %s sent without its payload", bare.prompt_id)
        return True
    log.error(
        "dead letter of %s (%s/%s) dropped: %s", bare.prompt_id, bare.stage, bare.kind, refused
    )
    return False
