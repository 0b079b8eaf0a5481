"""An outage reads as a few lines: "X unreachable since T, retrying", then "X reconnected
after N s", whatever the number of failed attempts in between; and the client libraries'
repeated errors are rate-limited.

- `Outage` is what a worker knows about one dependency (the broker, the bucket, a server):
  every call site that talks to it reports `failed(err)` or `succeeded()`; the first failure
  and the recovery are one line each, and a long outage adds one reminder per `remind_s`.
- `RepeatFilter`, on the log handlers, lets the first record of each (logger, template) of the
  noisy libraries through, then at most one per `interval_s` carrying how many were held back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

# loggers of the libraries that log every reconnect attempt of a broker outage
NOISY = ("aiokafka", "faust", "mode", "kafka")


def short_error(err: BaseException) -> str:
    """`Kind: first line` of an error, bounded: fit for one log line."""
    text = str(err).splitlines()[0][:200] if str(err) else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class Outage:
    def __init__(
        self,
        name: str,
        log: logging.Logger,
        *,
        remind_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        words: tuple[str, str] = ("unreachable", "reconnected"),
    ):
        self.name = name
        self.down_word, self.up_word = words
        self.log = log
        self.remind_s = remind_s
        self.clock = clock
        self.wall = wall
        self.since: float | None = None  # monotonic time of the first failure
        self.failures = 0
        self._reminded = 0.0

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, err: BaseException | str, took_s: float = 0.0) -> None:
        """One failed call; `took_s`: how long it ran before failing (a timeout), so that
        "since" is when the dependency stopped answering, not when we gave up waiting."""
        now = self.clock()
        self.failures += 1
        reason = err if isinstance(err, str) else short_error(err)
        if self.since is None:
            self.since = now - took_s
            self._reminded = now
            started = time.strftime("%H:%M:%S", time.localtime(self.wall() - took_s))
            self.log.warning(
                "%s %s since %s, retrying (%s)", self.name, self.down_word, started, reason
            )
        elif now - self._reminded >= self.remind_s:
            self._reminded = now
            self.log.warning(
                "%s still %s after %.0f s (%d failures; last: %s)",
                self.name,
                self.down_word,
                now - self.since,
                self.failures,
                reason,
            )

    def succeeded(self) -> None:
        if self.since is None:
            return
        self.log.warning(
            "%s %s after %.0f s (%d failures)",
            self.name,
            self.up_word,
            self.clock() - self.since,
            self.failures,
        )
        self.since = None
        self.failures = 0


class RepeatFilter(logging.Filter):
    """Per (logger, message template) of the `prefixes` loggers: the first record passes, then
    at most one per `interval_s`, which says how many similar ones were held back."""

    def __init__(
        self,
        interval_s: float = 30.0,
        prefixes: tuple[str, ...] = NOISY,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__()
        self.interval_s = interval_s
        self.prefixes = prefixes
        self.clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._held: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if not any(name == p or name.startswith(p + ".") for p in self.prefixes):
            return True
        key = (name, str(record.msg))
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        if len(self._last) > 10_000:  # templates are few; this only bounds a pathological case
            self._last.clear()
            self._held.clear()
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held and last is not None:
            record.msg = f"{record.msg} [{held} similar in the last {now - last:.0f} s]"
        return True


# Library lines logged as ERROR that are no error of a healthy run: faust's diagnostics of a
# partition it has not fetched lately (`verify_event_path`: a partition just assigned, or held
# by the generate worker's fair turns, streams/generate/fair.py, looks so after every normal
# rebalance; a real stall shows as lag in `draftgen status`), and aiokafka's while a new
# broker's group coordinator loads (retried).
NOT_ERRORS = (
    "Aiokafka has not sent fetch request",
    "Aiokafka has not received fetch response",
    "Aiokafka stopped fetching",
    "Broker stopped responding to fetch requests",
    "GroupCoordinatorNotAvailableError",
)


class NotErrorsFilter(logging.Filter):
    """Logs the `NOT_ERRORS` lines at INFO, whatever level their library gave them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO and any(t in record.getMessage() for t in NOT_ERRORS):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


_FILTERS = (NotErrorsFilter(), RepeatFilter())


def quiet_repeats(logger: logging.Logger | None = None) -> None:
    """Put the (one, process-wide) filters on every handler of `logger` (root): the library
    diagnostics that are no errors at INFO, and repeats held back."""
    for handler in (logger or logging.getLogger()).handlers:
        for found in _FILTERS:
            if found not in handler.filters:
                handler.addFilter(found)
