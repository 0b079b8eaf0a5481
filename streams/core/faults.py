"""Named places where the fault tests may end the process; inert unless a test arms them.

The tests' side (tests/faults.py) sets `armed` in the worker it starts; here nothing reads the
environment and nothing can fire.
"""

from __future__ import annotations

from collections.abc import Callable

# between a shard's commit marker and the acks that let its offsets be committed
AFTER_MARKER = "AFTER_MARKER"
# between a window's dead letters (sent) and its marker (not yet written)
AFTER_DEAD_LETTERS = "AFTER_DEAD_LETTERS"

# what a test runs at each crash point; None outside the fault tests
armed: Callable[[str], None] | None = None


def crash_point(name: str) -> None:
    if armed is not None:
        armed(name)
