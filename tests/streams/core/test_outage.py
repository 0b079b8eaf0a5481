"""Outages in a few lines: once when it starts, a reminder a minute, once when it ends; the
clients' repeated errors rate-limited per template."""

from __future__ import annotations

import asyncio
import logging

import pytest

from streams.core.outage import NotErrorsFilter, Outage, RepeatFilter
from streams.core.retry import Backoff, until_done


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_is_one_line_down_reminders_and_one_line_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    outage = Outage("broker", logging.getLogger("t"), remind_s=60, clock=clock)
    with caplog.at_level(logging.WARNING):
        outage.succeeded()  # nothing was down: nothing to say
        for _ in range(1000):  # 100 s of failures every 0.1 s
            outage.failed(ConnectionError("refused"))
            clock.now += 0.1
        outage.succeeded()
        outage.succeeded()
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 3, messages
    assert messages[0].startswith("broker unreachable since ") and "ConnectionError" in messages[0]
    assert "still unreachable after 60 s" in messages[1]
    assert messages[2] == "broker reconnected after 100 s (1000 failures)"


def test_since_is_when_a_failing_call_began(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    clock.now = 100.0
    outage = Outage("broker", logging.getLogger("t"), clock=clock, wall=lambda: 3600 * 12.0)
    with caplog.at_level(logging.WARNING):
        outage.failed("timed out", took_s=10.0)  # a send that waited 10 s for nothing
        clock.now = 105.0
        outage.succeeded()
    assert caplog.records[-1].getMessage().startswith("broker reconnected after 15 s")


def test_until_done_reports_to_its_outage_not_a_line_per_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures = [ConnectionError("down")] * 50

    async def call() -> str:
        if failures:
            raise failures.pop()
        return "ok"

    log = logging.getLogger("t")
    with caplog.at_level(logging.INFO):
        result = asyncio.run(until_done("writing", call, Backoff(0.0001, 0.0001), log))
    assert result == "ok"
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2, messages
    assert messages[0].startswith("writing failing since ")
    assert messages[1].startswith("writing succeeded after ")


def record(name: str, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)


def test_the_repeat_filter_passes_one_per_template_and_interval_with_a_count() -> None:
    clock = Clock()
    noisy = RepeatFilter(interval_s=30, clock=clock)
    passed = []
    for i in range(10_000):  # 25 s of a client library's reconnect errors, 2 templates
        clock.now = i * 0.0025
        for msg in ("Unable connect to %r: %r", "Unable to update metadata from %r (%r)"):
            rec = record("aiokafka.conn", msg, f"node-{i}", "refused")
            if noisy.filter(rec):
                passed.append(rec.getMessage())
    assert len(passed) == 2
    clock.now = 31
    rec = record("aiokafka.conn", "Unable connect to %r: %r", "node", "refused")
    assert noisy.filter(rec) and "[9999 similar in the last 31 s]" in rec.getMessage()
    assert all(noisy.filter(record("streams.generate.worker", "ours %s", i)) for i in range(5))


def test_fausts_no_fetch_diagnostics_after_a_rebalance_are_info_not_errors() -> None:
    """A partition just assigned, or held by the fair turns, is "not fetched since start" to
    faust, which logs it as ERROR after every normal rebalance."""
    demote = NotErrorsFilter()
    template = "Aiokafka has not sent fetch request for %r since start (started %s)"
    record = logging.LogRecord(
        "faust.transport.drivers.aiokafka",
        logging.ERROR,
        "",
        0,
        template,
        ("TP(topic='prompts', partition=10)", "5.60 minutes ago"),
        None,
    )
    assert demote.filter(record) and (record.levelno, record.levelname) == (logging.INFO, "INFO")
    other = logging.LogRecord("faust", logging.ERROR, "", 0, "Agent crashed", (), None)
    assert demote.filter(other) and other.levelno == logging.ERROR


def test_a_backoff_keeps_its_ceiling_however_many_attempts() -> None:
    """A server down for half an hour is probed past attempt 1,024: 2.0 ** 1024 overflowed a
    float and ended the prober, so the gate never opened again."""
    backoff = Backoff(1.0, 2.0, jitter=0.0)
    assert backoff.delay(1) == 1.0
    assert backoff.delay(1025) == 2.0
    assert backoff.delay(10**6) == 2.0
