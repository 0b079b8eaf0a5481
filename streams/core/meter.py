"""How a long command says how far it is: done / total, rate and ETA, and a final line.

One meter for `run`, `publish` and `replay`. On a terminal it is a tqdm bar; otherwise (a log
file, a pipe, CI) a plain line every `every_s` seconds, with no escape codes in it."""

from __future__ import annotations

import sys
import time
from typing import IO

from tqdm import tqdm

# a plain line this often when not on a terminal: enough to see it move in a log
PLAIN_EVERY_S = 10.0


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Meter:
    """`update(done, total)` as often as the command knows more; `close(final)` once."""

    def __init__(
        self,
        what: str,
        unit: str,
        total: int | None = None,
        *,
        tty: bool | None = None,
        every_s: float = PLAIN_EVERY_S,
        stream: IO[str] | None = None,
    ):
        self.what = what
        self.unit = unit
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self.started = time.monotonic()
        self._said = self.started
        on_terminal = self.stream.isatty() if tty is None else tty
        self._bar: tqdm[None] | None = (
            tqdm(total=total, desc=what, unit=unit, file=self.stream, dynamic_ncols=True)
            if on_terminal
            else None
        )

    def update(self, done: int, total: int | None = None) -> None:
        if total is not None:
            self.total = total
        if self._bar is not None:
            if self._bar.total != self.total:
                self._bar.total = self.total
            self._bar.update(done - self.done)
            self.done = done
            return
        self.done = done
        now = time.monotonic()
        if now - self._said >= self.every_s:
            self._said = now
            self._print(self.line(now))

    def rate(self, now: float | None = None) -> float:
        elapsed = (now or time.monotonic()) - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def line(self, now: float | None = None) -> str:
        """`what: done/total unit (share), rate/s, ETA` as far as each is known."""
        rate = self.rate(now)
        parts = [f"{self.what}: {self.done:,}" + (f"/{self.total:,}" if self.total else "")]
        parts[0] += f" {self.unit}s"
        if self.total:
            parts[0] += f" ({self.done / self.total:.0%})"
        parts.append(f"{rate:,.1f}/s")
        if self.total and rate > 0 and self.done < self.total:
            parts.append(f"ETA {_duration((self.total - self.done) / rate)}")
        return ", ".join(parts)

    def say(self, line: str) -> None:
        """A line of the command's own, above the bar when there is one."""
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            self._print(line)

    def close(self, final: str | None = None) -> None:
        """The last line: `final`, else where the meter stands ("": none, the caller says it)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if final != "":
            self._print(final or self.line())

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)
