"""`draftgen audit --out O --dataset D`: every completion the version's tokenize group has
committed is in the version, and under which generation settings its samples were made.

The version's extent: a sealed version's manifest offsets (`sealed.json`), else its group's
committed offsets now. Each completion below them, at (partition, offset) with key k, must be
accounted for by the window that counts there (sinks/resolve.py, at those offsets) in one of
three ways: k is a row of that window (a sample, or an earlier answer a later one replaced), k
is one of its recorded drops (`drops` of the marker), or the tokenize stage dead-lettered that
very record (a dead letter whose `origin` is `completions-P@O`: an undecodable record). For a
sealed version a window's rows count only if the manifest lists its shard. Anything else is
listed: an offset no window covers ("no window"), a key its window does not hold ("not in its
window"), a shard the manifest does not list ("not in the manifest").

The version's generation settings are those of its samples: the completion that became each
row the version keeps (the last one of its prompt in the window, when no later window replaced
it), hashed as the ledger hashes them (audit_ids.py `completion_settings`). dataset.json does
not record them: the tokenize worker never knows which model generated what it reads.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from sinks.resolve import resolve_partitions
from sinks.shards import ShardStore
from streams.core.errors import CliError
from streams.core.records import origin_of
from streams.core.settings import COMPLETIONS, KafkaSettings
from streams.core.settings.names import tokenize_group_name
from streams.tools.audit_ids import HashedIds, Hashes
from streams.tools.seal import group_offsets

MAX_LISTED = 10_000


def _hashed(ids: object) -> Hashes:
    values = list(ids)  # type: ignore[call-overload]
    return np.sort(np.fromiter(map(hash, values), dtype=np.int64, count=len(values)))


def _has(hashes: Hashes, digest: int) -> bool:
    at = int(np.searchsorted(hashes, digest))
    return at < len(hashes) and int(hashes[at]) == digest


@dataclass(frozen=True)
class Window:
    """What the audit keeps of a window that counts: its offsets and its ids as hashes."""

    start: int
    end: int  # inclusive
    rows: Hashes  # every row's prompt id
    kept: Hashes  # the rows the version keeps (not replaced by a later answer)
    drops: Hashes
    listed: bool = True  # sealed: its shard is in the manifest (or it has no rows)


@dataclass(frozen=True, slots=True)
class Unaccounted:
    partition: int
    offset: int
    prompt_id: str
    why: str


@dataclass
class VersionResult:
    dataset: str
    sealed: bool
    offsets: dict[int, int] = field(default_factory=dict)  # the version's extent
    checked: int = 0  # completions below them
    unaccounted: int = 0
    listed: list[Unaccounted] = field(default_factory=list)
    settings: Counter[str] = field(default_factory=Counter)  # samples per settings hash

    @property
    def mixed(self) -> bool:
        return len(self.settings) > 1

    @property
    def complete(self) -> bool:
        return self.unaccounted == 0 and not self.mixed


class VersionCheck:
    """Fed the tokenize stage's dead letters first, then the completions in offset order per
    partition."""

    def __init__(
        self,
        result: VersionResult,
        windows: dict[int, list[Window]],
        topic: str,
        listed: int = MAX_LISTED,
    ):
        self.result = result
        self.windows = windows
        self._starts = {p: [w.start for w in ws] for p, ws in windows.items()}
        self.topic = topic
        self.max_listed = listed
        self._letters = HashedIds()  # origins of the tokenize stage's dead letters
        # per partition: the window being read and, per prompt, the settings of its last answer
        self._open: dict[int, tuple[Window, dict[int, str]]] = {}

    def dead_letter(self, stage: str, origin: str | None) -> None:
        if stage == "tokenize" and origin:
            self._letters.add(origin)

    def completion(self, partition: int, offset: int, prompt_id: str, settings: str) -> None:
        if offset >= self.result.offsets.get(partition, 0):
            return  # beyond the version
        self.result.checked += 1
        digest = hash(prompt_id)
        window = self._window(partition, offset)
        why = None
        if window is None:
            why = "no window"
        elif _has(window.rows, digest):
            if not window.listed:
                why = "not in the manifest"
            else:
                self._answer(partition, window, digest, settings)
        elif not _has(window.drops, digest):
            why = "not in its window"
        if why is not None and origin_of(self.topic, partition, offset) not in self._letters:
            self.result.unaccounted += 1
            if len(self.result.listed) < self.max_listed:
                self.result.listed.append(Unaccounted(partition, offset, prompt_id, why))

    def unreadable(self, partition: int, offset: int, key: bytes | None) -> None:
        """A record that is no completion: the tokenize stage keys it by its Kafka key (a
        later answer of that prompt in its window replaces it), else its dead letter
        accounts for it."""
        self.completion(partition, offset, (key or b"").decode("utf-8", "replace"), "")

    def finish(self) -> VersionResult:
        for window, last in self._open.values():
            self._tally(window, last)
        self._open = {}
        return self.result

    def _window(self, partition: int, offset: int) -> Window | None:
        starts = self._starts.get(partition, [])
        at = bisect.bisect_right(starts, offset) - 1
        if at < 0:
            return None
        window = self.windows[partition][at]
        return window if offset <= window.end else None

    def _answer(self, partition: int, window: Window, digest: int, settings: str) -> None:
        current = self._open.get(partition)
        if current is None or current[0] is not window:
            if current is not None:
                self._tally(*current)
            current = self._open[partition] = (window, {})
        current[1][digest] = settings  # the window keeps its prompt's last answer

    def _tally(self, window: Window, last: dict[int, str]) -> None:
        for digest, settings in last.items():
            if _has(window.kept, digest):
                self.result.settings[settings] += 1


def load_windows(
    store: ShardStore, offsets: dict[int, int], sealed: bool
) -> dict[int, list[Window]]:
    """The windows that count at `offsets`, a partition at a time (sinks/resolve.py); for a
    sealed version, each marked by whether the manifest lists its shard, its kept rows the
    manifest's."""
    manifest = store.sealed() if sealed else None
    # a shard shared by a flush's windows holds each at its own row
    entries = {(e.path, e.row_start): e for e in manifest.shards} if manifest is not None else {}
    base = store.layout.base + "/"
    windows: dict[int, list[Window]] = {}
    for markers in store.markers_by_partition():
        resolution = resolve_partitions([markers], offsets)
        if resolution is None or not resolution.windows:
            continue
        for marker in resolution.windows:
            excluded = set(resolution.exclude.get(marker.key, []))
            listed = True
            if manifest is not None and marker.rows:
                entry = entries.get((store.shard_path(marker).removeprefix(base), marker.row_start))
                listed = entry is not None
                excluded = set(entry.exclude) if entry is not None else excluded
            kept = [pid for i, pid in enumerate(marker.prompt_ids) if i not in excluded]
            windows.setdefault(marker.partition, []).append(
                Window(
                    start=marker.start_offset,
                    end=marker.end_offset,
                    rows=_hashed(marker.prompt_ids),
                    kept=_hashed(kept),
                    drops=_hashed(marker.drops),
                    listed=listed,
                )
            )
    for partition in windows:
        windows[partition].sort(key=lambda w: w.start)
    return windows


async def open_version(
    kafka: KafkaSettings, store: ShardStore, dataset: str, listed: int = MAX_LISTED
) -> VersionCheck:
    """The check of version `dataset` in `store`: its extent and its windows."""
    info = await asyncio.to_thread(store.manifest)
    sealed = await asyncio.to_thread(store.sealed)
    if info is None and sealed is None:
        raise CliError(f"no dataset version {dataset!r} under {store.url} (no dataset.json)")
    if sealed is not None:
        offsets = {int(p): o for p, o in sealed.offsets.items()}
    else:
        group = str((info or {}).get("consumer_group") or kafka.group(tokenize_group_name(dataset)))
        offsets, _ = await group_offsets(kafka, group, kafka.topic(COMPLETIONS))
    windows = await asyncio.to_thread(load_windows, store, offsets, sealed is not None)
    result = VersionResult(dataset=dataset, sealed=sealed is not None, offsets=offsets)
    return VersionCheck(result, windows, kafka.topic(COMPLETIONS), listed)
