"""Which written windows make a dataset version, and each prompt's one outcome.

Two rules, applied by every reader (the live view, `status`, `seal`):

1. Fencing. A window is superseded when it overlaps (same partition, intersecting offset
   range) a window of a newer writer: a higher consumer-group generation, or the same
   generation written later (a restart with static membership keeps its generation). A revoked
   worker that was still writing (a zombie) can only have an older generation than the
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
from dataclasses import dataclass, field

from sinks.marker import ShardMarker

WindowKey = tuple[int, int, int]  # partition, start offset, generation


@dataclass
class Resolution:
    windows: list[ShardMarker] = field(default_factory=list)  # that count, by partition, offset
    superseded: list[ShardMarker] = field(default_factory=list)  # overlapped by a newer writer
    # per window that counts: indices of its rows that are not the prompt's latest outcome
    exclude: dict[WindowKey, list[int]] = field(default_factory=dict)
    samples: set[str] = field(default_factory=set)  # prompt ids whose outcome is a row
    drops: dict[str, str] = field(default_factory=dict)  # prompt id → reason kind

    @property
    def prompt_ids(self) -> set[str]:
        """Every prompt id with an outcome in this version."""
        return self.samples | set(self.drops)

    def kept_rows(self, marker: ShardMarker) -> int:
        return marker.rows - len(self.exclude.get(marker.key, ()))


def _newest_first(marker: ShardMarker) -> tuple[int, float]:
    return (marker.generation, marker.written_at)


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


def resolve(markers: Iterable[ShardMarker], committed: dict[int, int] | None = None) -> Resolution:
    """`committed`: per partition, the group's committed offset; when given, only windows that
    end before it count (a sealed version: those can no longer be superseded or replaced)."""
    by_partition: dict[int, list[ShardMarker]] = {}
    for marker in markers:
        by_partition.setdefault(marker.partition, []).append(marker)
    resolution = Resolution()
    # prompt id → (window key, row index) of its latest row, or None when the latest is a drop
    latest: dict[str, tuple[WindowKey, int] | None] = {}
    for partition in sorted(by_partition):
        windows, superseded = _fence(by_partition[partition])
        if committed is not None:
            cutoff = committed.get(partition, 0)
            windows = [w for w in windows if w.end_offset < cutoff]
        resolution.windows.extend(windows)
        resolution.superseded.extend(superseded)
        for window in windows:
            for index, prompt_id in enumerate(window.prompt_ids):
                earlier = latest.get(prompt_id)
                if earlier is not None:
                    resolution.exclude.setdefault(earlier[0], []).append(earlier[1])
                latest[prompt_id] = (window.key, index)
                resolution.drops.pop(prompt_id, None)
            for prompt_id, kind in window.drops.items():
                earlier = latest.get(prompt_id)
                if earlier is not None:
                    resolution.exclude.setdefault(earlier[0], []).append(earlier[1])
                latest[prompt_id] = None
                resolution.drops[prompt_id] = kind
    resolution.samples = {pid for pid, where in latest.items() if where is not None}
    for indices in resolution.exclude.values():
        indices.sort()
    return resolution
