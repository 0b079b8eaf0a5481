"""A record that crashes its worker twice is dead-lettered on the next start, not looped on.

Every record is handled inside a per-record `try` that turns any exception into a dead letter,
so a crash means something escaped that net (a bug in a window or an ack, a flush). The agent
loop reports such an escape with `crashed(tp, offset, error)` before it lets the worker die:
one small JSON file per worker in the state directory holds the partition, the offset being
handled and how many crashes in a row happened there. At the next start `poisoned()` says
whether a record is that offset after two crashes; the stage then dead-letters it (kind
`crash_loop`, with the recorded error) instead of handling it again, and the file is cleared.

Why a local file: it costs nothing per record (it is written only on a crash), survives the
restart of the process on the same host, and needs no broker (which may be what is failing).
A worker restarted on another host starts without it: that host's first two crashes on the
offset are counted afresh. A hard kill (SIGKILL, OOM) runs no Python, so it is not counted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import orjson

from streams.core.settings.base import default_state_dir

log = logging.getLogger(__name__)

# crashes on one offset before the next start dead-letters it
CRASHES_BEFORE_DEAD_LETTER = 2
CRASH_LOOP = "crash_loop"


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) + ".crash.json"


class CrashGuard:
    def __init__(self, state_dir: str | Path | None, name: str):
        directory = Path(state_dir) if state_dir else default_state_dir()
        self.path = directory / _file_name(name)
        self._entry = self._load()
        if self._entry:
            log.warning(
                "this worker crashed %d time(s) in a row on %s[%d]@%d: %s",
                self._entry["count"],
                self._entry["topic"],
                self._entry["partition"],
                self._entry["offset"],
                self._entry["error"],
            )

    def _load(self) -> dict[str, Any] | None:
        try:
            entry = orjson.loads(self.path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        keys = {"topic": str, "partition": int, "offset": int, "count": int, "error": str}
        if not isinstance(entry, dict) or any(
            not isinstance(entry.get(k), t) for k, t in keys.items()
        ):
            return None
        return entry

    def _same(self, topic: str, partition: int, offset: int) -> bool:
        entry = self._entry
        return bool(entry) and (entry["topic"], entry["partition"], entry["offset"]) == (  # type: ignore[index]
            topic,
            partition,
            offset,
        )

    def poisoned(self, topic: str, partition: int, offset: int) -> str | None:
        """The recorded error if this record crashed the worker twice in a row (and forget
        it: it is dead-lettered once); None otherwise."""
        if not self._same(topic, partition, offset):
            return None
        assert self._entry is not None
        if self._entry["count"] < CRASHES_BEFORE_DEAD_LETTER:
            return None
        error = str(self._entry["error"])
        self._entry = None
        with contextlib.suppress(OSError):
            self.path.unlink()
        return f"crashed the worker {CRASHES_BEFORE_DEAD_LETTER} times: {error}"

    def crashed(self, topic: str, partition: int, offset: int, error: BaseException) -> None:
        """Note a crash while handling this record (called on the way down; never raises)."""
        count = self._entry["count"] + 1 if self._same(topic, partition, offset) else 1  # type: ignore[index]
        text = f"{type(error).__name__}: {error}".splitlines()[0][:500] if str(error) else ""
        entry = {
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "count": count,
            "error": text or type(error).__name__,
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.path.parent, delete=False) as handle:
                handle.write(orjson.dumps(entry))
            os.replace(handle.name, self.path)
        except OSError as err:
            log.error("cannot record the crash in %s: %s", self.path, err)
            return
        self._entry = entry
        log.critical(
            "crashed (%d in a row) handling %s[%d]@%d: %s",
            count,
            topic,
            partition,
            offset,
            entry["error"],
        )
