"""Which shards make a dataset version (sinks/reader.py says which rows count): a sealed
version's manifest, or the commit markers that count now."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from sinks.layout import parse_shard_name
from sinks.manifest import SealedManifest
from sinks.resolve import Resolution, resolve
from sinks.shards import ShardMarker, ShardStore, read_present


@dataclass(frozen=True)
class ShardRef:
    """One shard of the version: where it is, what it should hold, which rows to leave out."""

    path: str  # on the store's filesystem (no protocol)
    partition: int
    start_offset: int
    rows: int
    sha256: str = ""
    exclude: frozenset[int] = frozenset()
    epoch: int = 0
    # the window's last completions offset (inclusive): where its rows' completions are
    end_offset: int = -1
    # where the window's rows start in the file (a shard shared by the windows of one flush),
    # and the rows the file holds (0: `rows`, the window's own file)
    row_start: int = 0
    file_rows: int = 0

    @property
    def key(self) -> tuple[int, int]:
        # unique among the windows that count, which never overlap
        return (self.partition, self.start_offset)

    @property
    def marker_key(self) -> tuple[int, int, int]:
        return (self.partition, self.start_offset, self.epoch)

    @property
    def kept(self) -> int:
        return self.rows - len(self.exclude)


def sealed_shards(store: ShardStore, manifest: SealedManifest) -> list[ShardRef]:
    refs = [
        ShardRef(
            path=f"{store.layout.base}/{entry.path}",
            partition=entry.partition,
            start_offset=entry.start_offset,
            rows=entry.rows,
            sha256=entry.sha256,
            exclude=frozenset(entry.exclude),
            epoch=(entry.epoch if entry.epoch is not None else parse_shard_name(entry.path)[2]),
            end_offset=entry.end_offset,
            row_start=entry.row_start,
            file_rows=entry.file_rows,
        )
        for entry in manifest.shards
        if entry.kept > 0
    ]
    return sorted(refs, key=file_order)


@dataclass
class MarkerCache:
    """Markers already read, by file name: a follow loop lists names and reads only new ones."""

    markers: dict[str, ShardMarker] = field(default_factory=dict)


def committed_shards(store: ShardStore, cache: MarkerCache) -> list[ShardRef]:
    committed_dir = store.layout.committed_dir
    store.fs.invalidate_cache(committed_dir)  # s3fs caches listings
    try:
        names = {
            os.path.basename(str(p)): str(p) for p in store.fs.glob(f"{committed_dir}/part-*.json")
        }
    except FileNotFoundError:
        names = {}
    for gone in set(cache.markers) - set(names):
        del cache.markers[gone]  # a window removed on adoption: forget it
    new = [path for name, path in names.items() if name not in cache.markers]
    if new:
        for path, raw in read_present(store.fs, new).items():
            cache.markers[os.path.basename(str(path))] = ShardMarker.decode(raw)
    # the windows that count and the rows replaced by a later answer (sinks/resolve.py)
    return resolved_shards(store, resolve(cache.markers.values()))


def resolved_shards(store: ShardStore, resolution: Resolution) -> list[ShardRef]:
    refs = [
        ShardRef(
            path=store.shard_path(m),
            partition=m.partition,
            start_offset=m.start_offset,
            rows=m.rows,
            sha256=m.sha256,
            exclude=frozenset(resolution.exclude.get(m.key, ())),
            epoch=m.epoch,
            end_offset=m.end_offset,
            row_start=m.row_start,
            file_rows=m.file_rows,
        )
        for m in resolution.windows
        if m.rows > len(resolution.exclude.get(m.key, ()))
    ]
    return sorted(refs, key=file_order)


def file_order(ref: ShardRef) -> tuple[str, int]:
    """Shards by file, then by place in it: a window's own file is named by its key, so those
    come in (partition, start offset) order, and the windows of a shared file come together
    (a reader opens it once)."""
    return (ref.path, ref.row_start)
