"""Which written windows make a dataset version, and each prompt's one outcome.

Two rules, applied by every reader (the live view, `status`, `seal`):

1. Fencing. A window is superseded when it overlaps (same partition, intersecting offset
   range) a window of a newer writer: a higher group epoch, or the same
   epoch written later (a restart with static membership keeps its epoch). A revoked
   worker that was still writing (a zombie) can only have an older epoch than the
   partition's new owner, and the new owner rewrites everything from the committed offset, so
   the windows that count never overlap and cover each committed offset once.
2. Latest answer wins. Completions are keyed by prompt_id, so every completion of a prompt is
   in the same partition, in the order it was produced. A prompt's outcome is the last one of
   the windows that count, in offset order: a row (sample) or a recorded drop, never both.
   Earlier rows of the same prompt are excluded (a regenerated answer replaces the first one).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from sinks.marker import ShardMarker

WindowKey = tuple[int, int, int]  # partition, start offset, epoch


@dataclass
class Resolution:
    windows: list[ShardMarker] = field(default_factory=list)  # that count, by partition, offset
    superseded: list[ShardMarker] = field(default_factory=list)  # overlapped by a newer writer
    # per window that counts: indices of its rows that are not the prompt's latest outcome
    exclude: dict[WindowKey, list[int]] = field(default_factory=dict)
    samples: set[str] = field(default_factory=set)  # prompt ids whose outcome is a row
    drops: dict[str, str] = field(default_factory=dict)  # prompt id → reason kind
    # how many prompt ids end as a row: len(samples), also when the ids were not kept
    sample_count: int = 0

    @property
    def prompt_ids(self) -> set[str]:
        """Every prompt id with an outcome in this version (when the ids were kept)."""
        return self.samples | set(self.drops)

    def kept_rows(self, marker: ShardMarker) -> int:
        return marker.rows - len(self.exclude.get(marker.key, ()))


Latest = dict[str, "tuple[WindowKey, int] | None"]


def _newest_first(marker: ShardMarker) -> tuple[int, float]:
    return (marker.epoch, marker.written_at)


def _fence(markers: list[ShardMarker]) -> tuple[list[ShardMarker], list[ShardMarker]]:
    """One partition's markers → (windows that count, by offset; superseded ones)."""
    starts: list[int] = []  # of accepted windows, sorted; accepted windows never overlap
    accepted: list[ShardMarker] = []
    superseded = []
    for marker in sorted(markers, key=_newest_first, reverse=True):
        at = bisect.bisect_right(starts, marker.end_offset)
        # the accepted window starting at or before our end is the only one that can overlap
        if at and accepted[at - 1].end_offset >= marker.start_offset:
            superseded.append(marker)
            continue
        starts.insert(at, marker.start_offset)
        accepted.insert(at, marker)
    return accepted, superseded


def _partition(
    resolution: Resolution, markers: list[ShardMarker], cutoff: int | None, latest: Latest
) -> list[ShardMarker]:
    """Resolve one partition's markers into `resolution`; `latest`: prompt id → (window key,
    row index) of its latest row, or None when its latest outcome is a drop. Returns the
    partition's windows that count."""
    windows, superseded = _fence(markers)
    if cutoff is not None:
        windows = [w for w in windows if w.end_offset < cutoff]
    resolution.windows.extend(windows)
    resolution.superseded.extend(superseded)
    for window in windows:
        key = window.key
        for index, prompt_id in enumerate(window.prompt_ids):
            earlier = latest.get(prompt_id)
            if earlier is not None:
                resolution.exclude.setdefault(earlier[0], []).append(earlier[1])
            latest[prompt_id] = (key, index)
            resolution.drops.pop(prompt_id, None)
        for prompt_id, kind in window.drops.items():
            earlier = latest.get(prompt_id)
            if earlier is not None:
                resolution.exclude.setdefault(earlier[0], []).append(earlier[1])
            latest[prompt_id] = None
            resolution.drops[prompt_id] = kind
    return windows


def _samples(resolution: Resolution, latest: Latest, keep_ids: bool) -> None:
    rows = [pid for pid, where in latest.items() if where is not None]
    resolution.sample_count += len(rows)
    if keep_ids:
        resolution.samples.update(rows)


def resolve(markers: Iterable[ShardMarker], committed: dict[int, int] | None = None) -> Resolution:
    """All markers at once. `committed`: per partition, the group's committed offset; when
    given, only windows that end before it count (a sealed version: those can no longer be
    superseded or replaced)."""
    by_partition: dict[int, list[ShardMarker]] = {}
    for marker in markers:
        by_partition.setdefault(marker.partition, []).append(marker)
    resolution = Resolution()
    latest: Latest = {}
    for partition in sorted(by_partition):
        cutoff = committed.get(partition, 0) if committed is not None else None
        _partition(resolution, by_partition[partition], cutoff, latest)
    _samples(resolution, latest, keep_ids=True)
    for indices in resolution.exclude.values():
        indices.sort()
    return resolution


def resolve_partitions(
    partitions: Iterable[list[ShardMarker]],
    committed: dict[int, int] | None = None,
    *,
    keep_ids: bool = True,
) -> Resolution | None:
    """The same as `resolve`, holding one partition's markers at a time, so memory does not
    grow with the version: every answer of a prompt is in one partition (completions are
    keyed by prompt id), so its latest outcome is found within it. Without `keep_ids`,
    `samples` is empty (`sample_count` counts them) and the windows are their markers without
    the per-row lists (prompt ids; row tokens unless a row is excluded). None if a prompt id
    has outcomes in two partitions (possible only after the topic's partition count
    changed): then `resolve` over all markers decides, as before."""
    resolution = Resolution()
    seen: list[np.ndarray] = []  # each partition's outcome ids, hashed: a cross-check only
    for markers in partitions:
        if not markers:
            continue
        partition = markers[0].partition
        cutoff = committed.get(partition, 0) if committed is not None else None
        latest: Latest = {}
        superseded = len(resolution.superseded)
        windows = _partition(resolution, markers, cutoff, latest)
        _samples(resolution, latest, keep_ids)
        seen.append(np.fromiter(map(hash, latest), dtype=np.int64, count=len(latest)))
        first = len(resolution.windows) - len(windows)
        for at, window in enumerate(windows, start=first):
            excluded = resolution.exclude.get(window.key)
            if excluded:
                excluded.sort()
            if not keep_ids:
                resolution.windows[at] = light_marker(window, keep_rows=bool(excluded))
        if not keep_ids:
            for at in range(superseded, len(resolution.superseded)):
                resolution.superseded[at] = light_marker(resolution.superseded[at], False)
    hashes = np.concatenate(seen) if seen else np.empty(0, dtype=np.int64)
    if len(np.unique(hashes)) != len(hashes):  # (or a 64-bit hash collision: also exact)
        return None
    return resolution


def light_marker(marker: ShardMarker, keep_rows: bool) -> ShardMarker:
    """The marker without its per-row lists: prompt ids, and row tokens unless `keep_rows`."""
    if not marker.prompt_ids and not marker.row_tokens:
        return marker
    if keep_rows:
        return replace(marker, prompt_ids=[])
    return replace(marker, prompt_ids=[], row_tokens=[], row_loss_tokens=[])
