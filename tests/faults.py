"""Crash points for the fault tests: the production side is one inert call per point
(streams/core/faults.py); arming, counting and exiting live here, beside the tests.

A worker started with `Crash(point, n).worker()` runs the CLI through this module
(`python -m tests.faults ...`), which arms the points its environment names:
`DRAFTGEN_FAULT_<POINT>=N` makes the N-th pass through the point end the process at once, as a
`kill -9` would there: no cleanup, no flush, no offset commit.
"""

from __future__ import annotations

import contextlib
import os
import runpy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from streams.core import faults

ROOT = Path(__file__).resolve().parents[1]
ENV_PREFIX = "DRAFTGEN_FAULT_"
# what `python -m` runs instead of `streams` for a worker that may crash
LAUNCHER = "tests.faults"
KILLED = 137


@dataclass(frozen=True)
class Crash:
    """End the worker at the `nth` pass through the crash point `point`."""

    point: str
    nth: int

    def env(self) -> dict[str, str]:
        """The worker's environment: the point armed, and this repository importable."""
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        return {f"{ENV_PREFIX}{self.point}": str(self.nth), "PYTHONPATH": path}


def arm(counts: dict[str, int], exit: Callable[[int], object] = os._exit) -> None:
    """Arm the points in `counts` (point → which pass ends the process) in this process."""
    remaining = {point: n for point, n in counts.items() if n > 0}

    def fire(point: str) -> None:
        if point not in remaining:
            return
        remaining[point] -= 1
        if remaining[point] == 0:
            del remaining[point]
            exit(KILLED)

    faults.armed = fire if remaining else None


@contextlib.contextmanager
def armed(counts: dict[str, int], exit: Callable[[int], object]) -> Iterator[None]:
    """`arm` for the duration of a block (in-process tests)."""
    arm(counts, exit)
    try:
        yield
    finally:
        faults.armed = None


def arm_from_environment() -> None:
    arm(
        {
            name.removeprefix(ENV_PREFIX): int(value or 0)
            for name, value in os.environ.items()
            if name.startswith(ENV_PREFIX)
        }
    )


if __name__ == "__main__":
    arm_from_environment()
    runpy.run_module("streams", run_name="__main__", alter_sys=True)
