"""Sealing: the manifest lists exactly the windows settled below the committed offsets, and
readers that find it use it."""

from __future__ import annotations

from pathlib import Path

from sinks.reader import DatasetReader
from sinks.shards import SampleRow, ShardStore


def rows(*ids: str) -> list[SampleRow]:
    return [SampleRow(pid, "src", [1, 2, 3], [0, 1, 1], "stop", "server") for pid in ids]


def test_the_manifest_holds_what_is_committed_and_the_reader_uses_it(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v1")
    store.write_shard(0, 0, 9, rows("a", "b"), epoch=1, drops={"c": "policy_length"})
    store.write_shard(0, 10, 19, rows("b", "d"), epoch=1)  # b answered again: it wins
    store.write_shard(0, 20, 29, rows("e"), epoch=1)  # beyond the committed offset
    store.write_shard(1, 0, 4, rows("f"), epoch=2)
    assert store.sealed() is None
    manifest = store.seal({0: 20, 1: 5})
    assert [(e.partition, e.start_offset, e.exclude) for e in manifest.shards] == [
        (0, 0, [1]),
        (0, 10, []),
        (1, 0, []),
    ]
    assert (manifest.samples, manifest.replaced, manifest.dropped) == (4, 1, {"c": "policy_length"})
    assert manifest.offsets == {"0": 20, "1": 5}
    assert store.sealed() == manifest
    # the reader takes the manifest's rows, not what was committed since
    store.write_shard(1, 5, 9, rows("g"), epoch=2)
    assert sorted(DatasetReader(store).table()["prompt_id"].to_pylist()) == ["a", "b", "d", "f"]


def test_a_row_replaced_after_the_cutoff_is_still_the_versions(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v1")
    store.write_shard(0, 0, 9, rows("a"), epoch=1)
    store.write_shard(0, 10, 19, rows("a"), epoch=1)  # not committed when sealed
    manifest = store.seal({0: 10})
    assert manifest.samples == 1 and manifest.shards[0].exclude == []
    assert DatasetReader(store).table()["prompt_id"].to_pylist() == ["a"]
