"""Writes until acknowledged, and dead letters that can always be written: cut to the producers'
limit, never retried when Kafka refuses them for good, sent bare if their topic's limit is lower."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError
from faust.exceptions import ProducerSendError

from streams.core.delivery import (
    letter_output,
    refused_for_good,
    send_dead_letter,
    send_until_acked,
)
from streams.core.records import DeadLetter
from streams.core.retry import Backoff
from streams.core.settings import KafkaSettings

log = logging.getLogger(__name__)
FAST = Backoff(0.001, 0.001)
KAFKA = KafkaSettings(bootstrap="127.0.0.1:1", max_message_bytes=64 * 1024)


def _faust_refusal() -> ProducerSendError:
    """What faust raises for a message over the producer's limit: the cause is chained."""
    try:
        try:
            raise MessageSizeTooLargeError("The message is 26214735 bytes when serialized")
        except MessageSizeTooLargeError as err:
            raise ProducerSendError(f"Error while sending: {err!r}") from err
    except ProducerSendError as wrapped:
        return wrapped


class FakeKafka:
    """Accepts values up to `limit` bytes (a topic's max.message.bytes); fails the first
    `down` sends as if the broker were unreachable."""

    def __init__(self, limit: int = 10**9, down: int = 0):
        self.limit, self.down = limit, down
        self.attempts: list[bytes] = []
        self.stored: list[tuple[str, bytes, bytes]] = []

    async def send(self, topic: str, key: bytes, value: bytes) -> None:
        self.attempts.append(value)
        if self.down:
            self.down -= 1
            raise KafkaConnectionError("broker unreachable")
        if len(value) > self.limit:
            raise _faust_refusal()
        self.stored.append((topic, key, value))


def test_a_wrapped_size_refusal_is_for_good_and_an_outage_is_not() -> None:
    assert refused_for_good(_faust_refusal())
    assert not refused_for_good(ProducerSendError("x"))
    assert not refused_for_good(KafkaConnectionError("down"))


def test_an_outage_is_waited_out_and_a_refusal_is_not_retried() -> None:
    kafka = FakeKafka(down=3)
    assert asyncio.run(send_until_acked(kafka.send, "t", b"k", b"v", FAST, log)) is None
    assert len(kafka.attempts) == 4 and kafka.stored == [("t", b"k", b"v")]

    kafka = FakeKafka(limit=1)
    why = asyncio.run(send_until_acked(kafka.send, "t", b"k", b"value", FAST, log))
    assert why is not None and "refused by Kafka" in why
    assert len(kafka.attempts) == 1  # at once, no backoff loop


def _huge_letter() -> DeadLetter:
    raw = b"\xff" * (5 * 1024 * 1024)  # 5 MB that is not UTF-8
    return DeadLetter.for_payload("tokenize", "invalid_utf8", "bad bytes", raw, "p1", "c-0@9")


def _output() -> tuple[str, bytes, bytes]:
    return letter_output(KAFKA, "dl", _huge_letter())


def test_a_dead_letter_over_the_limit_is_cut_to_fit_the_producer() -> None:
    kafka = FakeKafka()
    assert asyncio.run(send_dead_letter(kafka.send, _output(), FAST, log))
    [(topic, key, value)] = kafka.stored
    assert topic == "dl"
    assert KAFKA.too_large(key, value) is None
    letter = DeadLetter.decode(value)
    assert letter.payload_truncated and letter.payload_size == 5 * 1024 * 1024
    assert len(letter.payload_bytes()) > 40_000  # most of the room is used
    assert (letter.prompt_id, letter.origin) == ("p1", "c-0@9")


@pytest.mark.parametrize(("limit", "written"), [(4096, True), (100, False)])
def test_a_letter_refused_by_its_topic_goes_bare_once_then_is_dropped(
    limit: int, written: bool
) -> None:
    kafka = FakeKafka(limit=limit)  # a dead-letters topic created with a lower limit than ours
    ok = asyncio.run(send_dead_letter(kafka.send, _output(), FAST, log))
    assert ok is written
    assert len(kafka.attempts) == 2  # the cut letter, then the bare one: no retry loop
    if written:
        [(_, _, value)] = kafka.stored
        bare = DeadLetter.decode(value)
        assert (bare.payload_bytes(), bare.kind, bare.payload_truncated) == (
            b"",
            "invalid_utf8",
            True,
        )
