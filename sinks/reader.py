"""Read a dataset version for training: as a pyarrow Table, a Hugging Face `datasets.Dataset`,
or a stream of samples shard by shard, split across data-parallel ranks and loader workers.

Which rows make the version:

- sealed (`sealed.json`, sinks/manifest.py): exactly the manifest's shards, less its excluded
  rows; nothing else is listed.
- not sealed: the shards with a commit marker that count now (sinks/resolve.py: fenced by the
  writer's epoch, rows replaced by a later answer left out). A
  stream asked to `follow` lists the markers again every `poll_s` seconds and reads the shards
  committed since, until the version is sealed (then it reads what the manifest adds and stops),
  `idle_timeout_s` passes without a new shard, or `stop` says so.

Each shard's bytes are checked against the sha256 of its manifest entry or marker, so a shard
replaced under a reader (a window rewritten after a tokenize worker's crash) is never read as
the old one. PyTorch is optional: `SampleStream` is a plain iterable; `as_torch()` wraps it in a
`torch.utils.data.IterableDataset` when torch is installed.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads

from sinks.listing import (
    MarkerCache,
    ShardRef,
    committed_shards,
    resolved_shards,
    sealed_shards,
)
from sinks.manifest import SealedManifest
from sinks.resolve import light_marker
from sinks.shards import SHARD_SCHEMA, ShardMarker, ShardStore, conform

# listings a shard may fail its check in a row (rewritten under us) before it is an error
MAX_SHARD_RETRIES = 3


class ShardChanged(RuntimeError):
    """A listed shard is gone or its bytes differ from what its marker or manifest promises."""


def split_url(url: str) -> tuple[str, str]:
    """`s3://bucket/prefix/k26-v1` → (`s3://bucket/prefix`, `k26-v1`): the output root and the
    version, as the shard store takes them."""
    trimmed = url.rstrip("/")
    out, _, dataset = trimmed.rpartition("/")
    if not dataset or dataset in (".", ".."):
        raise ValueError(f"{url!r} does not name a dataset version directory")
    return out or ".", dataset


class DatasetReader:
    """One dataset version's shards, read through its `ShardStore` (any fsspec filesystem)."""

    def __init__(self, store: ShardStore, storage_options: dict[str, Any] | None = None):
        self.store = store
        # for readers that open the shards by URL themselves (`datasets`)
        self.storage_options = dict(storage_options or {})
        self._last: tuple[tuple[str, str], pa.Table] | None = None

    @property
    def name(self) -> str:
        return self.store.layout.dataset

    # -- what the version is -------------------------------------------------------------------

    def info(self) -> dict[str, Any] | None:
        """`dataset.json`: tokenizer, template hash, policy (None if the version has none)."""
        return self.store.manifest()

    def sealed(self) -> SealedManifest | None:
        path = self.store.layout.sealed
        self.store.fs.invalidate_cache(self.store.layout.base)
        try:
            raw = self.store.fs.cat_file(path)
        except FileNotFoundError:
            return None
        return SealedManifest.decode(raw)

    def shards(self) -> list[ShardRef]:
        """The version's shards with rows, in file order (`file_order`): the sealed manifest's,
        or else every committed one."""
        manifest = self.sealed()
        if manifest is not None:
            return sealed_shards(self.store, manifest)
        return resolved_shards(self.store, self.store.committed(keep_ids=False))

    def markers(self, refs: Sequence[ShardRef] | None = None) -> list[ShardMarker]:
        """The commit markers of the version's shards (`refs`, default `shards()`): drift,
        truncation, rows; read one partition at a time and kept without their per-row lists
        (prompt ids, row tokens)."""
        keys = {ref.marker_key for ref in (self.shards() if refs is None else refs)}
        return [
            light_marker(m, keep_rows=False)
            for markers in self.store.markers_by_partition()
            for m in markers
            if m.key in keys
        ]

    # -- reading -------------------------------------------------------------------------------

    def read_shard(self, ref: ShardRef, columns: Sequence[str] | None = None) -> pa.Table:
        """The shard's rows that belong to the version. Raises ShardChanged if its bytes are
        gone or not the ones promised."""
        table = self._file(ref).slice(ref.row_start, ref.rows)
        if ref.exclude:
            keep = np.ones(table.num_rows, dtype=bool)
            keep[[i for i in ref.exclude if i < table.num_rows]] = False
            table = table.filter(pa.array(keep))
        return table.select(list(columns)) if columns is not None else table

    def _file(self, ref: ShardRef) -> pa.Table:
        """The file's table; the last one read is kept, since the windows of a shared file come
        one after another (`file_order`)."""
        if self._last is not None and self._last[0] == (ref.path, ref.sha256):
            return self._last[1]
        try:
            data = self.store.fs.cat_file(ref.path)
        except FileNotFoundError:
            raise ShardChanged(f"{ref.path} is gone") from None
        if ref.sha256 and hashlib.sha256(data).hexdigest() != ref.sha256:
            raise ShardChanged(f"{ref.path} is not the shard its marker or manifest describes")
        table = conform(pa.ipc.open_stream(pa.py_buffer(data)).read_all())
        self._last = ((ref.path, ref.sha256), table)
        return table

    def tables(self, columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
        """One table per shard, in file order (`file_order`): bounded memory."""
        for ref in self.shards():
            yield self.read_shard(ref, columns)

    def table(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The whole version in memory: for small versions and tests; `tables()`, `stream()`
        and `draftgen export` read shard by shard."""
        tables = list(self.tables(columns))
        if tables:
            return pa.concat_tables(tables)
        schema = (
            SHARD_SCHEMA if columns is None else pa.schema([SHARD_SCHEMA.field(c) for c in columns])
        )
        return schema.empty_table()

    def arrow_dataset(self, columns: Sequence[str] | None = None) -> pads.Dataset:
        """A pyarrow Dataset (in memory: shards are IPC streams, which pyarrow's file-based
        datasets cannot open lazily; use `tables()` to bound memory)."""
        return pads.dataset(self.table(columns))

    def hf_dataset(self, cache_dir: str | None = None, keep_in_memory: bool = False) -> Any:
        """A `datasets.Dataset` of the version, loaded with the library's own Arrow builder
        (memory-mapped from its cache), rows in `shards()` order, excluded rows left out."""
        import datasets

        refs = self.shards()
        if not refs:
            return datasets.Dataset(SHARD_SCHEMA.empty_table())
        # each file once, in file order; a shared file's rows are indexed from its start
        first_of: dict[str, int] = {}
        files_rows = 0
        for ref in refs:
            if ref.path not in first_of:
                first_of[ref.path] = files_rows
                files_rows += ref.file_rows or ref.rows
        urls = [self.store.fs.unstrip_protocol(path) for path in first_of]
        loaded = datasets.load_dataset(
            "arrow",
            data_files=urls,
            split="train",
            storage_options=self.storage_options or None,
            cache_dir=cache_dir,
            keep_in_memory=keep_in_memory,
        )
        if loaded.num_rows != files_rows:
            raise ShardChanged("the shards changed while they were loaded")
        keep = [
            first_of[ref.path] + ref.row_start + i
            for ref in refs
            for i in range(ref.rows)
            if i not in ref.exclude
        ]
        return loaded if len(keep) == files_rows else loaded.select(keep)

    def stream(
        self,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        worker: int | None = None,
        num_workers: int | None = None,
        follow: bool = False,
        poll_s: float = 10.0,
        idle_timeout_s: float | None = None,
        stop: Callable[[], bool] | None = None,
        columns: Sequence[str] | None = None,
    ) -> SampleStream:
        """Samples shard by shard for one data-parallel rank (default: the RANK and WORLD_SIZE
        that torchrun sets, else 0 of 1) and loader worker (default: torch's worker info when
        iterated inside a DataLoader worker, else 0 of 1). See `SampleStream`."""
        return SampleStream(
            self,
            rank=rank,
            world_size=world_size,
            worker=worker,
            num_workers=num_workers,
            follow=follow,
            poll_s=poll_s,
            idle_timeout_s=idle_timeout_s,
            stop=stop,
            columns=tuple(columns) if columns is not None else None,
        )


def open_dataset(url: str, storage_options: dict[str, Any] | None = None) -> DatasetReader:
    """A dataset version by URL: `s3://bucket/prefix/NAME`, `file:///data/NAME`, `/data/NAME`."""
    out, dataset = split_url(url)
    return DatasetReader(ShardStore(out, dataset, storage_options), storage_options)


# -- streaming -------------------------------------------------------------------------------


def stable_slot(ref: ShardRef, slots: int) -> int:
    """The slot of a shard from its key alone, so every rank agrees whenever it listed."""
    digest = hashlib.blake2b(f"{ref.partition}:{ref.start_offset}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") % slots


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value and value.isdigit() else default


def _torch_worker() -> tuple[int, int] | None:
    """(id, count) of the DataLoader worker iterating us, without importing torch ourselves."""
    data = sys.modules.get("torch.utils.data")
    if data is None:
        return None
    info = data.get_worker_info()
    return (int(info.id), int(info.num_workers)) if info is not None else None


@dataclass
class SampleStream:
    """An iterable of samples (dicts: `input_ids` and `loss_mask` as numpy arrays, the other
    columns as Python values), shard by shard, for one slot of `world_size × num_workers`.

    Slots: a sealed version's shards are dealt round-robin in file order,
    which balances them; otherwise each shard goes to the slot its key hashes to, which every
    rank computes alike whenever it lists, so slots stay disjoint and together complete while
    the version grows. Ranks can receive unequal sample counts: a trainer that needs equal steps
    per rank must stop at the shortest (or pad). Each iteration starts again from the first
    shard; a follow iteration ends as the module docstring says.

    Known limit while following: after a tokenize worker's crash its uncommitted windows are
    rewritten, possibly with other bounds, so a stream that read one before may see its samples
    again under the new key; the sealed manifest is exact.
    """

    reader: DatasetReader
    rank: int | None = None
    world_size: int | None = None
    worker: int | None = None
    num_workers: int | None = None
    follow: bool = False
    poll_s: float = 10.0
    idle_timeout_s: float | None = None
    stop: Callable[[], bool] | None = None
    columns: tuple[str, ...] | None = None
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def slot(self) -> tuple[int, int]:
        """(this slot, number of slots)."""
        rank = self.rank if self.rank is not None else _env_int("RANK", 0)
        world = self.world_size if self.world_size is not None else _env_int("WORLD_SIZE", 1)
        if self.worker is not None or self.num_workers is not None:
            worker, workers = self.worker or 0, self.num_workers or 1
        else:
            worker, workers = _torch_worker() or (0, 1)
        if not (0 <= rank < world and 0 <= worker < workers):
            raise ValueError(f"rank {rank} of {world}, worker {worker} of {workers}: out of range")
        return rank * workers + worker, world * workers

    def assigned(self, refs: Sequence[ShardRef], sealed: bool) -> list[ShardRef]:
        me, slots = self.slot()
        if sealed:
            return [ref for i, ref in enumerate(refs) if i % slots == me]
        return [ref for ref in refs if stable_slot(ref, slots) == me]

    def shard_tables(self) -> Iterator[pa.Table]:
        """This slot's shards, read as they become available."""
        cache = MarkerCache()
        done: set[tuple[int, int]] = set()
        failures: dict[tuple[int, int], int] = {}
        # the rule that deals the first shards deals all of them, so slots stay disjoint
        sealed_at_start = self.reader.sealed() is not None
        last_new = self.clock()
        while True:
            manifest = self.reader.sealed()
            if manifest is not None:
                refs = sealed_shards(self.reader.store, manifest)
            else:
                refs = committed_shards(self.reader.store, cache)
            changed = False
            for ref in self.assigned(refs, sealed_at_start):
                if ref.key in done:
                    continue
                try:
                    table = self.reader.read_shard(ref, self.columns)
                except ShardChanged:
                    failures[ref.key] = failures.get(ref.key, 0) + 1
                    if manifest is not None or failures[ref.key] > MAX_SHARD_RETRIES:
                        raise
                    # rewritten under us (a crashed window redone): its new marker is the truth
                    cache.markers.pop(
                        os.path.basename(self.reader.store.layout.marker(*ref.marker_key)), None
                    )
                    changed = True
                    continue
                done.add(ref.key)
                last_new = self.clock()
                yield table
            if manifest is not None:
                return
            if not self.follow and not changed:
                return
            if self.stop is not None and self.stop():
                return
            if self.idle_timeout_s is not None and self.clock() - last_new >= self.idle_timeout_s:
                return
            self.sleep(self.poll_s)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for table in self.shard_tables():
            yield from table_rows(table)

    def as_torch(self) -> Any:
        """This stream as a `torch.utils.data.IterableDataset` (needs torch). Each DataLoader
        worker then reads its own shards (torch's worker info), unless `worker` was fixed."""
        return _torch_stream_class()(self)


# One wrapper class per torch IterableDataset base, reachable as `sinks.reader.TorchSampleStream`
# (module __getattr__), so DataLoader workers started by spawn can unpickle it.
_TORCH_CLASSES: dict[type, type] = {}


def _torch_stream_class() -> type:
    from torch.utils.data import IterableDataset

    if IterableDataset not in _TORCH_CLASSES:

        class TorchSampleStream(IterableDataset):  # type: ignore[misc, type-arg, unused-ignore]
            def __init__(self, stream: SampleStream):
                self.stream = stream

            def __iter__(self) -> Iterator[dict[str, Any]]:
                return iter(self.stream)

        TorchSampleStream.__qualname__ = "TorchSampleStream"
        _TORCH_CLASSES[IterableDataset] = TorchSampleStream
    return _TORCH_CLASSES[IterableDataset]


def __getattr__(name: str) -> Any:
    if name == "TorchSampleStream":
        return _torch_stream_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def table_rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    """Rows of a shard table, the token lists as numpy views (no per-token Python objects);
    other lists (`flags`) as Python lists."""
    table = table.combine_chunks()
    lists: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    scalars: dict[str, list[Any]] = {}
    for name in table.column_names:
        column = table.column(name)
        array = column.chunk(0) if column.num_chunks else pa.array([], column.type)
        if pa.types.is_list(array.type) and pa.types.is_integer(array.type.value_type):
            offsets = array.offsets.to_numpy()
            lists[name] = (array.flatten().to_numpy(), offsets - offsets[0])
        else:
            scalars[name] = array.to_pylist()
    for i in range(table.num_rows):
        row: dict[str, Any] = {name: values[i] for name, values in scalars.items()}
        for name, (flat, offsets) in lists.items():
            row[name] = flat[offsets[i] : offsets[i + 1]]
        yield {name: row[name] for name in table.column_names}


__all__ = [
    "DatasetReader",
    "SampleStream",
    "ShardChanged",
    "ShardRef",
    "committed_shards",
    "open_dataset",
    "sealed_shards",
    "split_url",
    "stable_slot",
    "table_rows",
]
