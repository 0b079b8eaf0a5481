"""Worker heartbeats: each worker's counters, gauges and recent rates, published every few
seconds to the compacted `worker-stats` topic, keyed by worker id, so `draftgen status` can
find every live worker without knowing where it runs.

A graceful shutdown publishes a tombstone for its key; a crashed worker's last heartbeat
simply grows old, and readers judge liveness from its age and interval.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections import deque
from dataclasses import dataclass, field

import orjson

from streams.core.settings import WORKER_STATS, KafkaSettings
from streams.core.topic_reader import TopicReader
from streams.observe.figures import Figure

SCHEMA_VERSION = 1


def worker_id(role: str, label: str) -> str:
    """Unique per process, so two workers on one server never overwrite each other."""
    return f"{role}|{label}|{socket.gethostname()}|{os.getpid()}"


@dataclass
class Heartbeat:
    role: str  # generate | tokenize
    label: str  # the server URL (generate) or the dataset name (tokenize)
    worker: str
    time: float  # wall clock, seconds
    interval_s: float
    started_at: float
    counters: dict[str, int] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    # per second over the last `rate_window_s`; counters named as in `counters`
    rates: dict[str, float] = field(default_factory=dict)
    rate_window_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)  # by kind
    metrics_url: str | None = None
    host: str = ""
    pid: int = 0
    # facts as text (generate: `exact_ids`, how its server returns exact token ids)
    notes: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        return orjson.dumps({"v": SCHEMA_VERSION, **self.__dict__})

    @classmethod
    def decode(cls, raw: bytes) -> Heartbeat:
        data = orjson.loads(raw)
        if not isinstance(data, dict) or data.get("v") != SCHEMA_VERSION:
            raise ValueError("not a v1 heartbeat")
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})

    def figure(self, declared: Figure) -> float:
        """This worker's value of a declared figure (`figure_of`); 0 when it sent none."""
        section = self.gauges if declared.kind == "gauge" else self.counters
        return float(section.get(declared.key, 0))

    def rate(self, declared: Figure) -> float:
        """Per second over the rate window, of a counter."""
        return float(self.rates.get(declared.key, 0.0))

    def age(self, now: float) -> float:
        return max(0.0, now - self.time)

    def live(self, now: float) -> bool:
        """Missed fewer than three beats (with slack for a busy event loop)."""
        return self.age(now) <= 3 * self.interval_s + 5.0


class RateWindow:
    """Per-second rates of cumulative counters over a sliding window of snapshots.

    Fed once per heartbeat, so it costs nothing per record."""

    def __init__(self, window_s: float = 30.0):
        self.window_s = window_s
        self._snapshots: deque[tuple[float, dict[str, int]]] = deque()

    def add(self, now: float, counters: dict[str, int]) -> tuple[dict[str, float], float]:
        """Record a snapshot; return (rates, seconds actually covered)."""
        self._snapshots.append((now, dict(counters)))
        # keep one snapshot at or before the window start, so the window is fully covered
        while len(self._snapshots) > 2 and self._snapshots[1][0] <= now - self.window_s:
            self._snapshots.popleft()
        first_t, first = self._snapshots[0]
        span = now - first_t
        if span <= 0:
            return {name: 0.0 for name in counters}, 0.0
        return {name: (value - first.get(name, 0)) / span for name, value in counters.items()}, span


class BeatSchedule:
    """When a heartbeat is due: every `interval_s`, and at the next check after a note changed
    (a server's way of returning ids is known seconds after start: a short run would end
    before the next regular beat, and `run`'s console would never say it)."""

    def __init__(self, interval_s: float, check_s: float = 1.0):
        self.interval_s = interval_s
        # the timer's period; a beat is due half a check early so timer jitter never skips one
        self.check_s = min(check_s, interval_s)
        self._sent_at: float | None = None
        self._notes: dict[str, str] = {}

    def due(self, now: float, notes: dict[str, str]) -> bool:
        early = (
            self._sent_at is not None and now - self._sent_at < self.interval_s - self.check_s / 2
        )
        if early and notes == self._notes:
            return False
        self._sent_at = now
        self._notes = dict(notes)
        return True


class HeartbeatReader:
    """Reads the worker-stats topic without a consumer group, incrementally; keeps the latest
    heartbeat per worker id (a tombstone removes it)."""

    def __init__(self, kafka: KafkaSettings):
        self.kafka = kafka
        self.latest: dict[str, Heartbeat] = {}
        self._reader = TopicReader(kafka, kafka.topic(WORKER_STATS))

    async def poll(self) -> dict[str, Heartbeat]:
        if await self._reader.open():  # no topic yet: no worker has started
            await self._reader.read_to_end(lambda record: self._apply(record.key, record.value))
        return self.latest

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        name = (key or b"").decode("utf-8", "replace")
        if value is None:
            self.latest.pop(name, None)
            return
        with contextlib.suppress(ValueError, TypeError):  # a foreign or future record: skip
            self.latest[name] = Heartbeat.decode(value)

    async def close(self) -> None:
        await self._reader.close()


def new_heartbeat(role: str, label: str, interval_s: float, metrics_url: str | None) -> Heartbeat:
    now = time.time()
    return Heartbeat(
        role=role,
        label=label,
        worker=worker_id(role, label),
        time=now,
        interval_s=interval_s,
        started_at=now,
        metrics_url=metrics_url,
        host=socket.gethostname(),
        pid=os.getpid(),
    )


def refresh(
    beat: Heartbeat,
    window: RateWindow,
    counters: dict[str, int],
    gauges: dict[str, float],
    errors: dict[str, int],
    notes: dict[str, str] | None = None,
) -> Heartbeat:
    """The next heartbeat of a worker from its current figures."""
    beat.time = time.time()
    beat.counters = counters
    beat.gauges = gauges
    beat.errors = errors
    beat.notes = dict(notes or {})
    beat.rates, beat.rate_window_s = window.add(time.monotonic(), counters)
    return beat


def heartbeats_of(beats: dict[str, Heartbeat], role: str) -> list[Heartbeat]:
    return sorted((b for b in beats.values() if b.role == role), key=lambda b: (b.label, b.worker))


__all__ = [
    "Heartbeat",
    "HeartbeatReader",
    "RateWindow",
    "heartbeats_of",
    "new_heartbeat",
    "refresh",
    "worker_id",
]
