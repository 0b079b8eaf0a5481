"""Injected failures: which request fails, and how."""

from __future__ import annotations

import os
import random
import sys
from enum import Enum

from compose.emulator import errors
from compose.emulator.settings import EmulatorSettings

# the exit status of a server that aborts (SIGABRT's 128 + 6), as a failed CUDA assertion does
CRASH_STATUS = 134


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


def refuse_or_crash(settings: EmulatorSettings, prompt_text: str) -> None:
    """A node that refuses everything answers its status; a prompt that crashes servers ends
    the process here, before any answer (its requests' connections are reset)."""
    if settings.refuse_status:
        message = (
            f"The model `{settings.model}` does not exist."
            if settings.refuse_status == 404
            else "Refused (--refuse-all)."
        )
        raise errors.ApiError(settings.refuse_status, message, "NotFoundError", "refused")
    if settings.crash_on and settings.crash_on in prompt_text:
        print(f"emulator: a prompt with {settings.crash_on!r} crashed the server", file=sys.stderr)
        sys.stderr.flush()
        os._exit(CRASH_STATUS)
