"""Injected failures: which request fails, and how."""

from __future__ import annotations

import random
from enum import Enum

from compose.emulator.settings import EmulatorSettings


class Fault(Enum):
    UNAVAILABLE = "injected_503"  # 503, as a full queue answers
    INTERNAL = "injected_500"  # 500 after some decoding
    TIMEOUT = "timeout"  # no answer; the connection is reset after a long hang
    DROP = "drop"  # the connection closes in the middle of the response body


class FaultInjector:
    """One draw per request attempt (so a retry can succeed), seeded for repeatable runs.

    The per-prompt context-length failure is decided elsewhere, from the prompt's hash.
    """

    def __init__(self, settings: EmulatorSettings) -> None:
        self._rng = random.Random(f"faults:{settings.seed}")
        self._table = [
            (settings.rate_503, Fault.UNAVAILABLE),
            (settings.rate_500, Fault.INTERNAL),
            (settings.rate_timeout, Fault.TIMEOUT),
            (settings.rate_drop, Fault.DROP),
        ]

    def draw(self) -> Fault | None:
        point = self._rng.random()
        for rate, fault in self._table:
            if point < rate:
                return fault
            point -= rate
        return None
