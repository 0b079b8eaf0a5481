"""What `draftgen run` says on its console while it waits, besides its progress line: a server
that does not answer or refuses the API key (and when it is back), the way each server returns
exact token ids, and generate or tokenize workers that restart or stop reporting.

Read from the workers' heartbeats (`worker-stats`), so it costs the run one incremental topic
read a poll; each change is one line, said once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from streams.core.settings import KafkaSettings
from streams.generate.stats import AUTH, DOWN, REFUSING
from streams.observe.heartbeat import Heartbeat, HeartbeatReader
from streams.tools import worker_figures as fig

NATIVE_HINT = "--api native --tokenizer-dir DIR gets exact ids from its /generate"


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _who(beat: Heartbeat) -> str:
    what = "server" if beat.role == "generate" else "dataset"
    return f"{beat.role} worker (pid {beat.pid}) of {what} {beat.label}"


class ConsoleWatch:
    """Turns heartbeats into one line per change (`lines`), remembering what it said."""

    def __init__(self) -> None:
        self._paused: dict[str, str] = {}  # server -> "down" | "auth", while paused
        self._ids: dict[str, str] = {}  # server -> the exact-ids note said
        self._workers: dict[tuple[str, str], set[str]] = {}  # (role, label) -> worker ids seen
        self._silent: set[str] = set()  # worker ids said to have stopped reporting

    def lines(self, beats: dict[str, Heartbeat], now: float) -> list[str]:
        out: list[str] = []
        live = [b for b in beats.values() if b.live(now)]
        out += self._servers([b for b in live if b.role == "generate"], now)
        out += self._restarts(beats, now)
        return out

    def _servers(self, live: list[Heartbeat], now: float) -> list[str]:
        out: list[str] = []
        by_server: dict[str, list[Heartbeat]] = {}
        for beat in live:
            by_server.setdefault(beat.label, []).append(beat)
        for server, beats in sorted(by_server.items()):
            state = fig.paused_state(beats)
            said = self._paused.get(server, "")
            if state != said:
                out.append(_pause_line(server, state, said, now))
                if state:
                    self._paused[server] = state
                else:
                    self._paused.pop(server, None)
            note = next((n for b in beats if (n := b.notes.get(fig.EXACT_IDS))), "")
            if note and self._ids.get(server) != note:
                self._ids[server] = note
                out.append(_ids_line(server, note))
        return out

    def _restarts(self, beats: dict[str, Heartbeat], now: float) -> list[str]:
        """A worker seen live that stops beating; a new one that takes over from a silent one."""
        out: list[str] = []
        for beat in sorted(beats.values(), key=lambda b: b.started_at):
            key = (beat.role, beat.label)
            seen = self._workers.setdefault(key, set())
            if not beat.live(now):
                if beat.worker in seen and beat.worker not in self._silent:
                    self._silent.add(beat.worker)
                    out.append(
                        f"{_who(beat)} has not reported since {_clock(beat.time)}: crashed or hung?"
                    )
                continue
            if beat.worker not in seen:
                silent = sorted(w for w in seen if w in self._silent or w not in beats)
                if silent:
                    out.append(
                        f"{_who(beat)} started at {_clock(beat.started_at)}, after "
                        f"{len(silent)} earlier one(s) stopped: a restart"
                    )
                    seen.difference_update(silent)  # replaced: said once
                seen.add(beat.worker)
            self._silent.discard(beat.worker)
        return out


def _pause_line(server: str, state: str, said: str, now: float) -> str:
    if state == AUTH:
        return (
            f"server {server} refuses the API key (HTTP 401/403): its worker waits; set "
            "DRAFTGEN_API_KEY (or OPENAI_API_KEY) to the server's --api-key"
        )
    if state == REFUSING:
        return (
            f"server {server} fails every request for good ({_clock(now)}): it takes no new "
            "prompts and dead-letters none; check its served model name and its log"
        )
    if state == DOWN:
        return (
            f"server {server} is not answering ({_clock(now)}): its worker waits for it and "
            "spends no prompt; check the URL and that the server is up"
        )
    return f"server {server} is answering again ({_clock(now)})"


def _ids_line(server: str, note: str) -> str:
    if note.startswith("exact"):
        return f"server {server}: token ids {note}"
    return f"server {server}: token ids {note}, not token-exact from the server ({NATIVE_HINT})"


class RunConsole:
    """`ConsoleWatch` over the run's broker: `poll()` prints what changed."""

    def __init__(self, kafka: KafkaSettings, say: Callable[[str], None]):
        self.reader = HeartbeatReader(kafka)
        self.watch = ConsoleWatch()
        self.say = say

    async def poll(self) -> None:
        for line in self.watch.lines(await self.reader.poll(), time.time()):
            self.say(line)

    async def close(self) -> None:
        await self.reader.close()
