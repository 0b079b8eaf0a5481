"""Write Arrow shards and their commit markers; read back only what is committed.

A shard is durable before its marker is written, and readers trust only shards with a marker.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import fsspec
import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa

from sinks.layout import DatasetLayout, parse_shard_name
from sinks.manifest import SealedManifest, ShardEntry
from sinks.marker import ShardMarker
from sinks.resolve import Resolution, resolve, resolve_partitions

SHARD_SCHEMA = pa.schema(
    [
        ("prompt_id", pa.string()),
        ("source", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("num_tokens", pa.int32()),
        ("num_loss_tokens", pa.int32()),
        ("finish_reason", pa.string()),
        ("token_source", pa.string()),
        ("drift", pa.bool_()),
        ("conversation_id", pa.string()),
        # the source row's own id (null: it had none, or the shard predates the column)
        ("source_id", pa.string()),
        # quality-gate rules the sample broke and was kept with (`--on-repetition flag`, …);
        # empty when none, null in shards that predate the column
        ("flags", pa.list_(pa.string())),
        # what made the sample, as JSON (CompletionRecord.provenance): the model, who served
        # it, the recipe, the sampling parameters sent and the thinking switch, the
        # preprocessing profile, the tokenizer's and template's hashes; null in older shards
        ("provenance", pa.string()),
    ]
)


def conform(table: pa.Table) -> pa.Table:
    """A shard's table in the current schema: columns added since it was written come as
    nulls, so shards of older writers read alike (and concatenate with newer ones)."""
    if table.schema.names == SHARD_SCHEMA.names:
        return table
    for column in SHARD_SCHEMA:
        if column.name not in table.schema.names:
            table = table.append_column(column, pa.nulls(table.num_rows, column.type))
    return table.select(
        [*SHARD_SCHEMA.names, *(n for n in table.schema.names if n not in SHARD_SCHEMA.names)]
    )


# a row's ids or mask: numpy arrays from the tokenize stage, lists elsewhere
Tokens = Sequence[int] | npt.NDArray[np.integer[Any]]


@dataclass
class SampleRow:
    prompt_id: str
    source: str
    input_ids: Tokens
    loss_mask: Tokens
    finish_reason: str
    token_source: str
    drift: bool | None = None
    conversation_id: str | None = None
    source_id: str | None = None
    # why it drifted (samples.py's DriftCause.key); counted in the marker, not a column
    drift_cause: str | None = None
    # cut to the sample policy's --max-seq-len; counted in the marker, not a column
    truncated: bool = False
    # the SGLang preprocessing profile of its prompt; in the marker, not a column
    normalization: str = ""
    flags: Sequence[str] = ()
    provenance: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


def _list_array(rows: Sequence[Tokens], dtype: Any, arrow_type: pa.DataType) -> pa.Array:
    # One flat buffer plus offsets: no per-element Python objects on the Arrow side.
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int32, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = (
        np.concatenate([np.asarray(r, dtype=dtype) for r in rows]) if rows else np.array([], dtype)
    )
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=arrow_type))


def rows_to_table(rows: Sequence[SampleRow]) -> pa.Table:
    masks = [r.loss_mask for r in rows]
    return pa.table(
        {
            "prompt_id": pa.array([r.prompt_id for r in rows], pa.string()),
            "source": pa.array([r.source for r in rows], pa.string()),
            "input_ids": _list_array([r.input_ids for r in rows], np.int32, pa.int32()),
            "loss_mask": _list_array(masks, np.int8, pa.int8()),
            "num_tokens": pa.array([len(r.input_ids) for r in rows], pa.int32()),
            "num_loss_tokens": pa.array([int(np.count_nonzero(m)) for m in masks], pa.int32()),
            "finish_reason": pa.array([r.finish_reason for r in rows], pa.string()),
            "token_source": pa.array([r.token_source for r in rows], pa.string()),
            "drift": pa.array([r.drift for r in rows], pa.bool_()),
            "conversation_id": pa.array([r.conversation_id for r in rows], pa.string()),
            "source_id": pa.array([r.source_id for r in rows], pa.string()),
            "flags": pa.array([list(r.flags) for r in rows], pa.list_(pa.string())),
            "provenance": pa.array([r.provenance for r in rows], pa.string()),
        },
        schema=SHARD_SCHEMA,
    )


def table_to_ipc_stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


@dataclass(frozen=True)
class WindowRows:
    """A window's content as written: its offsets, its rows and its recorded drops."""

    partition: int
    start_offset: int
    end_offset: int
    rows: Sequence[SampleRow]
    epoch: int = 0
    drops: dict[str, str] = field(default_factory=dict)
    # the sample policy's verdicts (ShardMarker.gate, .gate_examples)
    gate: dict[str, dict[str, int]] = field(default_factory=dict)
    gate_examples: dict[str, list[str]] = field(default_factory=dict)


class ShardStore:
    """One dataset version's shards and markers on an fsspec filesystem."""

    def __init__(self, out: str, dataset: str, storage_options: dict[str, Any] | None = None):
        self.fs, root = fsspec.core.url_to_fs(out, **(storage_options or {}))
        self._local = "file" in _protocols(self.fs)
        self.layout = DatasetLayout(root, dataset)
        self.url = out.rstrip("/") + f"/{dataset}"

    # -- writing -------------------------------------------------------------------------------

    def _put(self, path: str, data: bytes) -> None:
        """Durable, all-or-nothing write: a single PUT on object stores, fsync+rename locally."""
        if not self._local:
            self.fs.pipe_file(path, data)
            return
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def write_manifest(self, info: dict[str, Any]) -> None:
        self._put(self.layout.manifest, orjson.dumps(info, option=orjson.OPT_INDENT_2))

    def write_shard(
        self,
        partition: int,
        start_offset: int,
        end_offset: int,
        rows: Sequence[SampleRow],
        *,
        epoch: int = 0,
        drops: dict[str, str] | None = None,
    ) -> ShardMarker:
        """Write one window: its shard, then its marker. A window with no samples gets a marker
        only."""
        window = WindowRows(partition, start_offset, end_offset, rows, epoch, drops or {})
        return self.write_windows([window])[0]

    def write_windows(self, windows: Sequence[WindowRows]) -> list[ShardMarker]:
        """Write the windows of one flush: one shard file for all their rows, durable first,
        then a marker per window (its rows' place in the file). Each marker commits its own
        window, so a crash between two markers leaves the later windows unmarked, as a crash
        before a lone window's marker does. One window gets the file named by its key (a
        rewrite replaces it); several share a file with a name of its own (`shared_shard`)."""
        tables = [rows_to_table(window.rows) for window in windows]
        filled = [w for w in windows if w.rows]
        sha, name = "", ""
        if filled:
            data = table_to_ipc_stream(pa.concat_tables([t for t in tables if t.num_rows]))
            sha = hashlib.sha256(data).hexdigest()
            first = filled[0]
            if len(filled) == 1:
                path = self.layout.shard(first.partition, first.start_offset, first.epoch)
            else:
                token = uuid.uuid4().hex[:12]
                path = self.layout.shared_shard(
                    first.partition, first.start_offset, first.epoch, token
                )
                name = path.rpartition("/")[2]
            self._put(path, data)
        markers, row_start = [], 0
        in_file = sum(len(w.rows) for w in windows) if name else 0
        for window, table in zip(windows, tables, strict=True):
            marker = self._marker(window, table, sha if window.rows else "", name, row_start)
            marker = replace(marker, shard_rows=in_file if marker.shard else 0)
            row_start += len(window.rows)
            self._put(
                self.layout.marker(window.partition, window.start_offset, window.epoch),
                marker.encode(),
            )
            markers.append(marker)
        return markers

    @staticmethod
    def _marker(
        window: WindowRows, table: pa.Table, sha256: str, shard: str, row_start: int
    ) -> ShardMarker:
        rows = window.rows
        return ShardMarker(
            partition=window.partition,
            start_offset=window.start_offset,
            end_offset=window.end_offset,
            rows=len(rows),
            tokens=int(sum(r.num_tokens for r in rows)),
            loss_tokens=int(pa.compute.sum(table["num_loss_tokens"]).as_py() or 0),
            sha256=sha256,
            prompt_ids=[r.prompt_id for r in rows],
            written_at=time.time(),
            compared=sum(r.drift is not None for r in rows),
            drifted=sum(r.drift is True for r in rows),
            truncated=sum(r.truncated for r in rows),
            epoch=window.epoch,
            drops=dict(window.drops),
            row_tokens=table["num_tokens"].to_pylist(),
            row_loss_tokens=table["num_loss_tokens"].to_pylist(),
            drift_causes=ShardMarker.top_causes(r.drift_cause for r in rows),
            row_normalizations=[r.normalization for r in rows],
            shard=shard if rows else "",
            row_start=row_start if shard and rows else 0,
            gate=window.gate,
            gate_examples=window.gate_examples,
        )

    def delete_window(self, partition: int, start_offset: int, epoch: int = 0) -> None:
        """Marker first, so a reader never sees the shard unmarked-but-trusted. A shard the
        window shared with others of its flush stays (theirs may count); without a marker
        pointing at its rows, no reader reads them."""
        for path in (
            self.layout.marker(partition, start_offset, epoch),
            self.layout.shard(partition, start_offset, epoch),
        ):
            if self.fs.exists(path):
                self.fs.rm_file(path)

    # -- reading -------------------------------------------------------------------------------

    def _marker_paths(self, pattern: str = "part-*.json") -> list[str]:
        # s3fs caches listings: a stale one would hide markers written since (by us or others).
        self.fs.invalidate_cache(self.layout.committed_dir)
        try:
            return sorted(self.fs.glob(f"{self.layout.committed_dir}/{pattern}"))
        except FileNotFoundError:
            return []

    def markers(self, partition: int | None = None) -> list[ShardMarker]:
        pattern = f"part-{partition:04d}-*.json" if partition is not None else "part-*.json"
        paths = self._marker_paths(pattern)
        return [ShardMarker.decode(raw) for _, raw in sorted(read_present(self.fs, paths).items())]

    def markers_by_partition(self) -> Iterator[list[ShardMarker]]:
        """Every marker, one partition's at a time (names listed once, contents read per
        partition), so a caller holds one partition's markers, not the version's."""
        by_partition: dict[int, list[str]] = {}
        for path in self._marker_paths():
            by_partition.setdefault(parse_shard_name(path)[0], []).append(path)
        for partition in sorted(by_partition):
            found = read_present(self.fs, by_partition[partition])
            yield [ShardMarker.decode(raw) for _, raw in sorted(found.items())]

    def committed(
        self, offsets: dict[int, int] | None = None, *, keep_ids: bool = True
    ) -> Resolution:
        """What the version holds now: the windows that count and each prompt's latest outcome;
        with `offsets` (the group's committed offsets), only what is settled below them.
        Resolved a partition at a time (sinks/resolve.py); without `keep_ids` no prompt id is
        kept (`sample_count` counts them) and the windows come without their per-row lists,
        so memory does not grow with the version."""
        resolution = resolve_partitions(self.markers_by_partition(), offsets, keep_ids=keep_ids)
        return resolution if resolution is not None else resolve(self.markers(), offsets)

    def sealed(self) -> SealedManifest | None:
        """The sealed manifest, if the version was sealed (`draftgen seal`)."""
        self.fs.invalidate_cache(self.layout.base)
        if not self.fs.exists(self.layout.sealed):
            return None
        return SealedManifest.decode(self.fs.cat_file(self.layout.sealed))

    def fenced(self) -> bool:
        """Whether the version is sealed or being sealed: writers must not change it."""
        self.fs.invalidate_cache(self.layout.base)
        return bool(self.fs.exists(self.layout.fence) or self.fs.exists(self.layout.sealed))

    def write_fence(self) -> None:
        self._put(self.layout.fence, orjson.dumps({"fenced_at": time.time()}))

    def sealed_offsets(self) -> dict[int, int] | None:
        """The committed offsets the sealed manifest covers (None: not sealed)."""
        sealed = self.sealed()
        return None if sealed is None else {int(p): o for p, o in sealed.offsets.items()}

    def seal(self, offsets: dict[int, int]) -> SealedManifest:
        """Write the manifest of exactly the windows and rows settled below `offsets`."""
        resolution = self.committed(offsets, keep_ids=False)
        entries, tokens = [], 0
        for marker in resolution.windows:
            excluded = resolution.exclude.get(marker.key, [])
            tokens += marker.tokens - sum(marker.row_tokens[i] for i in excluded)
            if marker.rows == 0:
                continue
            entries.append(
                ShardEntry(
                    path=self.shard_path(marker).removeprefix(self.layout.base + "/"),
                    partition=marker.partition,
                    start_offset=marker.start_offset,
                    end_offset=marker.end_offset,
                    rows=marker.rows,
                    sha256=marker.sha256,
                    exclude=list(excluded),
                    row_start=marker.row_start,
                    epoch=marker.epoch,
                    file_rows=marker.file_rows,
                )
            )
        manifest = SealedManifest(
            dataset=self.layout.dataset,
            sealed_at=time.time(),
            shards=entries,
            samples=resolution.sample_count,
            tokens=tokens,
            drops=dict(Counter(resolution.drops.values())),
            dropped=dict(resolution.drops),
            offsets={str(p): o for p, o in sorted(offsets.items())},
            replaced=sum(len(x) for x in resolution.exclude.values()),
        )
        self._put(self.layout.sealed, manifest.encode())
        return manifest

    def shard_path(self, marker: ShardMarker) -> str:
        if marker.shard:
            return f"{self.layout.data_dir}/{marker.shard}"
        return self.layout.shard(marker.partition, marker.start_offset, marker.epoch)

    def committed_shard_paths(self) -> list[str]:
        """The files that hold committed windows, each once."""
        windows = self.committed(keep_ids=False).windows
        return list(dict.fromkeys(self.shard_path(m) for m in windows if m.rows > 0))

    def committed_shard_urls(self) -> list[str]:
        """Full URLs (with protocol) of committed shards, for pyarrow / datasets readers. A shard
        may also hold superseded rows (`committed().exclude`); sinks/reader.py leaves them out."""
        return [self.fs.unstrip_protocol(p) for p in self.committed_shard_paths()]

    def read_shard(self, marker: ShardMarker) -> pa.Table:
        """The window's rows (all of them: `committed().exclude` says which do not count)."""
        with self.fs.open(self.shard_path(marker), "rb") as handle:
            table = conform(pa.ipc.open_stream(handle).read_all())
        return table.slice(marker.row_start, marker.rows)

    def manifest(self) -> dict[str, Any] | None:
        if not self.fs.exists(self.layout.manifest):
            return None
        return dict(orjson.loads(self.fs.cat_file(self.layout.manifest)))


def read_present(fs: fsspec.AbstractFileSystem, paths: list[str]) -> dict[str, bytes]:
    """The contents of those of `paths` that still exist (path → bytes). A new owner removes
    the uncommitted windows of a partition it adopts, so a file listed a moment ago may be
    gone; any other error is raised."""
    if not paths:
        return {}
    found = fs.cat(paths, on_error="return")
    contents: dict[str, bytes] = {}
    for path, value in found.items():
        if isinstance(value, FileNotFoundError):
            continue
        if isinstance(value, BaseException):
            raise value
        contents[path] = value
    return contents


def _protocols(fs: fsspec.AbstractFileSystem) -> Iterable[str]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


__all__ = [
    "SHARD_SCHEMA",
    "SampleRow",
    "ShardMarker",
    "ShardStore",
    "conform",
    "parse_shard_name",
    "rows_to_table",
    "table_to_ipc_stream",
]
