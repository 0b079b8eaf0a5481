"""Deliberate crash points for the fault tests; inert unless the environment arms them.

`DRAFTGEN_FAULT_<NAME>=N` makes the N-th pass through the point end the process at once, as a
`kill -9` would there: no cleanup, no flush, no offset commit.
"""

from __future__ import annotations

import os


class CrashPoint:
    def __init__(self, name: str):
        self.name = name
        self._remaining = int(os.environ.get(f"DRAFTGEN_FAULT_{name}") or 0)

    def hit(self) -> None:
        if self._remaining <= 0:
            return
        self._remaining -= 1
        if self._remaining == 0:
            os._exit(137)


# between a shard's commit marker and the acks that let its offsets be committed
AFTER_MARKER = "AFTER_MARKER"
# between a window's dead letters (sent) and its marker (not yet written)
AFTER_DEAD_LETTERS = "AFTER_DEAD_LETTERS"
