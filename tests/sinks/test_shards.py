"""Shard naming and the write-then-mark protocol, on the local filesystem (no S3 needed)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import orjson
import pyarrow as pa
import pytest

from sinks.layout import DatasetLayout, parse_shard_name, shard_stem
from sinks.manifest import SealedManifest, ShardEntry
from sinks.marker import EPOCH_KEY, MAX_DRIFT_CAUSES
from sinks.reader import DatasetReader
from sinks.shards import (
    SHARD_SCHEMA,
    SampleRow,
    ShardMarker,
    ShardStore,
    WindowRows,
    read_present,
    table_to_ipc_stream,
)


def test_shard_names_hold_partition_start_offset_and_generation() -> None:
    assert shard_stem(3, 1234, 7) == "part-0003-000000001234-g00000007"
    layout = DatasetLayout("s3://bucket/prefix/", "v1")
    assert layout.shard(3, 1234, 5) == (
        "s3://bucket/prefix/v1/data/part-0003-000000001234-g00000005.arrow"
    )
    assert layout.marker(3, 1234) == (
        "s3://bucket/prefix/v1/_committed/part-0003-000000001234-g00000000.json"
    )
    assert parse_shard_name(layout.shard(12, 99, 4)) == (12, 99, 4)
    with pytest.raises(ValueError):
        parse_shard_name("part-3-12.arrow")
    with pytest.raises(ValueError):
        shard_stem(-1, 0)


def rows(*ids: str) -> list[SampleRow]:
    return [SampleRow(pid, "src", [1, 2, 3, 4], [0, 0, 1, 1], "stop", "server") for pid in ids]


def test_written_shard_is_committed_and_readable(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v1")
    marker = store.write_shard(0, 100, 102, rows("a", "b", "c"))
    assert (marker.rows, marker.tokens, marker.loss_tokens) == (3, 12, 6)
    assert marker.prompt_ids == ["a", "b", "c"]
    table = DatasetReader(store).table()
    assert table.column("prompt_id").to_pylist() == ["a", "b", "c"]
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert table.schema.field("loss_mask").type == pa.list_(pa.int8())
    # IPC stream format, readable with pyarrow directly
    with open(store.committed_shard_paths()[0], "rb") as handle:
        assert pa.ipc.open_stream(handle).read_all().num_rows == 3


def test_rewrite_after_crash_replaces_the_same_object(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v1")
    store.write_shard(1, 0, 9, rows("a", "b"), epoch=4)
    store.write_shard(1, 0, 12, rows("a", "b", "c"), epoch=4)  # same writer epoch
    assert len(store.markers()) == 1
    assert DatasetReader(store).table().num_rows == 3


def test_a_newer_generation_s_rewrite_sits_beside_the_older_one_and_wins(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v1")
    zombie = store.write_shard(1, 0, 12, rows("a", "b", "c"), epoch=4)
    owner = [
        store.write_shard(1, 0, 5, rows("a"), epoch=5),
        store.write_shard(1, 6, 9, rows("b", "d"), epoch=5),
    ]
    assert len(store.markers()) == 3
    resolution = store.committed()
    assert (resolution.windows, resolution.superseded) == (owner, [zombie])
    assert store.committed_shard_paths() == [store.shard_path(m) for m in owner]
    assert DatasetReader(store).table().column("prompt_id").to_pylist() == ["a", "b", "d"]
    assert store.read_shard(zombie).num_rows == 3  # still there, read on its own


def test_the_version_holds_each_prompt_s_latest_outcome_once(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v1")
    batch = rows("a", "b", "c")
    batch[0].source = "first"
    store.write_shard(0, 0, 2, batch)
    again = rows("a", "e")
    again[0].source = "second"
    store.write_shard(0, 3, 6, again, drops={"b": "policy_length"})
    store.write_shard(1, 0, 0, [], drops={"x": "bad_shape"})
    table = DatasetReader(store).table()
    assert list(zip(table["prompt_id"].to_pylist(), table["source"].to_pylist(), strict=True)) == [
        ("c", "src"),
        ("a", "second"),
        ("e", "src"),
    ]
    resolution = store.committed()
    assert resolution.samples == {"a", "c", "e"}
    assert resolution.drops == {"b": "policy_length", "x": "bad_shape"}


def test_readers_ignore_shards_without_a_marker(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v1")
    store.write_shard(2, 0, 1, rows("a"))
    store.write_shard(2, 2, 3, rows("b"))
    Path(store.layout.marker(2, 2)).unlink()  # crashed between shard and marker
    assert DatasetReader(store).table().column("prompt_id").to_pylist() == ["a"]
    store.delete_window(2, 0)
    assert DatasetReader(store).table().num_rows == 0


def test_window_without_samples_gets_a_marker_only(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v1")
    marker = store.write_shard(0, 5, 7, [])
    assert marker.rows == 0
    assert store.committed_shard_paths() == []
    assert not Path(store.layout.shard(0, 5)).exists()


def test_marker_records_generation_drops_and_per_row_tokens(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v1")
    batch = rows("a", "b")
    batch[1].input_ids, batch[1].loss_mask = [1, 2], [0, 1]
    marker = store.write_shard(3, 40, 44, batch, epoch=7, drops={"c": "template_error"})
    assert (marker.epoch, marker.key) == (7, (3, 40, 7))
    assert marker.drops == {"c": "template_error"}
    assert (marker.row_tokens, marker.row_loss_tokens) == ([4, 2], [2, 1])
    assert store.markers() == [marker]
    assert Path(store.shard_path(marker)).name == "part-0003-000000000040-g00000007.arrow"
    store.delete_window(3, 40, 6)  # another epoch's window: not this one
    assert store.markers() == [marker]
    store.delete_window(3, 40, 7)
    assert store.markers() == [] and not Path(store.shard_path(marker)).exists()


def test_marker_counts_drift_and_truncation(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v1")
    batch = rows("a", "b", "c", "d")
    batch[0].drift, batch[1].drift, batch[2].drift = True, False, True
    batch[3].truncated = True
    marker = store.write_shard(0, 0, 3, batch)
    assert (marker.compared, marker.drifted, marker.truncated) == (3, 2, 1)
    assert store.markers() == [marker]


def test_marker_counts_the_most_frequent_drift_causes(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v1")
    batch = rows(*(f"p{i}" for i in range(MAX_DRIFT_CAUSES + 4)))
    turn = "turn: server '\\n' vs rendered '\\n\\n'"
    for row in batch[:3]:
        row.drift, row.drift_cause = True, turn
    # more distinct causes than a marker keeps: the rarest are left out
    for index, row in enumerate(batch[3:]):
        row.drift, row.drift_cause = True, f"prompt: server '{index}' vs rendered 'x'"
    marker = store.write_shard(0, 0, len(batch) - 1, batch)
    assert len(marker.drift_causes) == MAX_DRIFT_CAUSES
    assert next(iter(marker.drift_causes.items())) == (turn, 3)
    assert store.markers() == [marker]  # the causes survive encode and decode
    assert store.write_shard(1, 0, 1, rows("a")).drift_causes == {}


def test_markers_from_before_the_drift_report_still_decode() -> None:
    old = b'{"partition":1,"start_offset":0,"end_offset":4,"rows":2,"tokens":8,"loss_tokens":4,'
    old += b'"sha256":"x","prompt_ids":["a","b"],"written_at":1.0}'
    marker = ShardMarker.decode(old)
    assert (marker.rows, marker.compared, marker.drifted, marker.truncated) == (2, 0, 0, 0)
    assert (marker.epoch, marker.drops, marker.row_tokens) == (0, {}, [])
    assert marker.drift_causes == {}
    newer = old[:-1] + b',"some_future_field":7}'
    assert ShardMarker.decode(newer) == marker


def test_the_epoch_is_stored_under_its_earlier_key_in_markers_and_manifests(
    tmp_path: Path,
) -> None:
    """A window's group epoch is stored as "generation" (EPOCH_KEY), the key it had before it
    was named apart from an LLM's generation: markers and manifests of either version read
    alike."""
    store = ShardStore(str(tmp_path), "v1")
    marker = store.write_shard(2, 0, 1, rows("a", "b"), epoch=5)
    stored = orjson.loads(marker.encode())
    assert stored[EPOCH_KEY] == 5 and "epoch" not in stored
    assert ShardMarker.decode(marker.encode()).epoch == 5
    entry = ShardEntry("data/x.arrow", 2, 0, 1, 2, "x", epoch=5)
    manifest = SealedManifest("v1", 1.0, [entry], samples=2, tokens=8)
    assert orjson.loads(manifest.encode())["shards"][0][EPOCH_KEY] == 5
    assert SealedManifest.decode(manifest.encode()).shards == [entry]


def test_readers_skip_a_window_removed_between_listing_and_reading(tmp_path: Path) -> None:
    """A new owner removes the uncommitted windows of a partition it adopts: a reader that
    listed them a moment before reads what is still there instead of failing."""
    store = ShardStore(str(tmp_path), "v1")
    store.write_shard(0, 0, 1, rows("a", "b"), epoch=1)
    store.write_shard(0, 2, 2, rows("c"), epoch=1)
    store.write_shard(1, 0, 0, rows("d"), epoch=1)
    listing = store.fs.glob(f"{store.layout.committed_dir}/part-*.json")
    assert len(listing) == 3
    removed = {"once": False}
    glob = store.fs.glob

    def listed_before_the_removal(pattern: str) -> list[str]:
        if not removed["once"]:
            removed["once"] = True
            found = glob(pattern)
            store.delete_window(0, 2, 1)  # the adoption's cleanup, right after our listing
            return found
        return glob(pattern)

    store.fs.glob = listed_before_the_removal  # type: ignore[method-assign]
    assert sorted(m.prompt_ids[0] for m in store.markers()) == ["a", "d"]
    assert removed["once"]
    store.fs.glob = glob  # type: ignore[method-assign]


def test_read_present_raises_errors_other_than_a_missing_file(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v1")
    store.write_shard(0, 0, 0, rows("a"), epoch=1)
    (marker,) = store.fs.glob(f"{store.layout.committed_dir}/part-*.json")
    assert set(read_present(store.fs, [marker, f"{marker}.gone"])) == {marker}
    with pytest.raises(IsADirectoryError):
        read_present(store.fs, [marker, store.layout.committed_dir])


def test_rows_carry_their_source_id_and_shards_without_the_column_read_as_null(
    tmp_path: Path,
) -> None:
    store = ShardStore(str(tmp_path), "v1")
    new = [
        SampleRow("a", "src", [1, 2], [0, 1], "stop", "server", source_id="row-1"),
        SampleRow("b", "src", [1, 2], [0, 1], "stop", "server"),
    ]
    store.write_shard(0, 0, 1, new)
    # a shard of an earlier writer, without the column
    old_marker = store.write_shard(1, 0, 0, rows("c"))
    path = store.shard_path(old_marker)
    table = pa.ipc.open_stream(store.fs.cat_file(path)).read_all().drop_columns(["source_id"])
    data = table_to_ipc_stream(table)
    store.fs.pipe_file(path, data)
    # its marker describes those bytes (the reader checks them)
    rewritten = dataclasses.replace(old_marker, sha256=hashlib.sha256(data).hexdigest())
    store.fs.pipe_file(store.layout.marker(1, 0), rewritten.encode())
    read = DatasetReader(store).table()
    assert dict(zip(read["prompt_id"].to_pylist(), read["source_id"].to_pylist(), strict=True)) == {
        "a": "row-1",
        "b": None,
        "c": None,
    }
    assert read.schema.names == SHARD_SCHEMA.names


def test_the_windows_of_one_flush_share_a_shard_and_each_reads_as_its_own(
    tmp_path: Path,
) -> None:
    store = ShardStore(str(tmp_path), "v1")
    markers = store.write_windows(
        [
            WindowRows(0, 10, 11, rows("a", "b"), epoch=2),
            WindowRows(1, 4, 4, [], epoch=2, drops={"x": "policy_length"}),
            WindowRows(5, 0, 2, rows("c", "d", "e"), epoch=3),
        ]
    )
    files = list((tmp_path / "v1" / "data").iterdir())
    assert len(files) == 1 and parse_shard_name(files[0].name) == (0, 10, 2)
    assert [(m.shard, m.row_start, m.rows) for m in markers] == [
        (files[0].name, 0, 2),
        ("", 0, 0),  # a marker only: its drop
        (files[0].name, 2, 3),
    ]
    assert markers[0].sha256 == hashlib.sha256(files[0].read_bytes()).hexdigest()
    assert [store.read_shard(m)["prompt_id"].to_pylist() for m in (markers[0], markers[2])] == [
        ["a", "b"],
        ["c", "d", "e"],
    ]
    assert store.committed_shard_paths() == [str(files[0])]  # once
    assert DatasetReader(store).table()["prompt_id"].to_pylist() == ["a", "b", "c", "d", "e"]

    # sealed: the manifest keeps each window's place and epoch
    manifest = store.seal({0: 12, 1: 5, 5: 3})
    assert [(e.partition, e.row_start, e.epoch) for e in manifest.shards] == [
        (0, 0, 2),
        (5, 2, 3),
    ]
    sealed = DatasetReader(store)
    assert [ref.epoch for ref in sealed.shards()] == [2, 3]
    assert sealed.table()["prompt_id"].to_pylist() == ["a", "b", "c", "d", "e"]


def test_a_window_of_a_shared_shard_rewritten_or_removed_leaves_the_others_whole(
    tmp_path: Path,
) -> None:
    """A crash after the first markers of a flush: the unmarked window is rewritten by the
    same epoch. Its rewrite must not replace the file the marked windows point at."""
    store = ShardStore(str(tmp_path), "v1")
    first, second = store.write_windows(
        [WindowRows(0, 0, 1, rows("a", "b")), WindowRows(1, 0, 0, rows("c"))]
    )
    store.delete_window(0, 0)  # as adoption removes an uncommitted window
    store.write_windows([WindowRows(0, 0, 2, rows("a", "b", "f")), WindowRows(2, 0, 0, rows("g"))])
    assert len(list((tmp_path / "v1" / "data").iterdir())) == 2  # the first file stays
    table = DatasetReader(store).table()
    assert sorted(table["prompt_id"].to_pylist()) == ["a", "b", "c", "f", "g"]
    assert store.read_shard(second)["prompt_id"].to_pylist() == ["c"]
    assert first.shard != store.markers(0)[0].shard
    # loaded by `datasets` file by file: the removed window's rows in the first file left out
    loaded = DatasetReader(store).hf_dataset(cache_dir=str(tmp_path / "cache"))
    assert loaded["prompt_id"] == table["prompt_id"].to_pylist()
