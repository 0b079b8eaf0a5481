"""Admission and concurrency, as SGLang's scheduler does it: a running batch, a waiting queue."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from compose.emulator.errors import queue_full


@dataclass
class Stats:
    """Counters exposed at GET /stats (handy for tests and benchmarks)."""

    requests: int = 0
    completed: int = 0
    running: int = 0
    queued: int = 0
    peak_running: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    drift: int = 0
    tool_calls: int = 0
    # wall-clock time of the latest request (benchmarks time a worker's reaction with it)
    last_request_at: float | None = None
    errors: Counter[str] = field(default_factory=Counter)

    def count_request(self) -> None:
        self.requests += 1
        self.last_request_at = time.time()

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "completed": self.completed,
            "running": self.running,
            "queued": self.queued,
            "peak_running": self.peak_running,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "drift": self.drift,
            "tool_calls": self.tool_calls,
            "last_request_at": self.last_request_at,
            "errors": dict(self.errors),
        }


class Scheduler:
    """At most max_running requests decode at once; the rest wait, up to max_queued (0 = no cap)."""

    def __init__(self, max_running: int, max_queued: int, stats: Stats) -> None:
        self._slots = asyncio.Semaphore(max_running) if max_running > 0 else None
        self._max_queued = max_queued
        self.stats = stats

    def _must_wait(self) -> bool:
        return self._slots is not None and self._slots.locked()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold a running slot; raises the 503 queue-full error when the queue is at its cap."""
        stats = self.stats
        if self._must_wait() and self._max_queued > 0 and stats.queued >= self._max_queued:
            raise queue_full()
        if self._slots is not None:
            stats.queued += 1
            try:
                await self._slots.acquire()
            finally:
                stats.queued -= 1
        stats.running += 1
        stats.peak_running = max(stats.peak_running, stats.running)
        try:
            yield
        finally:
            stats.running -= 1
            if self._slots is not None:
                self._slots.release()
