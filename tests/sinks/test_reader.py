"""The reader on a `file://` store written with ShardStore (no Kafka): which rows make a version
(committed only, or the sealed manifest less its exclusions), the three ways to read them, and
the stream's split across ranks and workers, following shards committed later."""

from __future__ import annotations

import itertools
import pickle
import threading
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sinks.manifest import SealedManifest, ShardEntry
from sinks.reader import DatasetReader, ShardChanged, open_dataset, split_url
from sinks.shards import SampleRow, ShardStore
from tests.polling import wait_for


def rows(*ids: str, source: str = "src") -> list[SampleRow]:
    out = []
    for pid in ids:
        n = 3 + len(pid) % 4
        ids_ = [hash((pid, i)) % 1000 for i in range(n)]
        out.append(SampleRow(pid, source, ids_, [0] * (n - 2) + [1, 1], "stop", "server"))
    return out


def write(store: ShardStore, partition: int, start: int, *ids: str) -> None:
    store.write_shard(partition, start, start + max(len(ids), 1) - 1, rows(*ids))


def seal(store: ShardStore, exclude: dict[tuple[int, int], list[int]]) -> SealedManifest:
    """A sealed manifest of the listed windows (as `draftgen seal` writes it)."""
    entries = []
    for marker in store.markers():
        key = (marker.partition, marker.start_offset)
        if key not in exclude:
            continue
        entries.append(
            ShardEntry(
                path=store.shard_path(marker).removeprefix(store.layout.base + "/"),
                partition=marker.partition,
                start_offset=marker.start_offset,
                end_offset=marker.end_offset,
                rows=marker.rows,
                sha256=marker.sha256,
                exclude=exclude[key],
            )
        )
    manifest = SealedManifest(
        dataset=store.layout.dataset,
        sealed_at=0.0,
        shards=entries,
        samples=sum(e.kept for e in entries),
        tokens=0,
    )
    store._put(store.layout.sealed, manifest.encode())
    return manifest


@pytest.fixture
def store(tmp_path: Path) -> ShardStore:
    return ShardStore(f"file://{tmp_path}/out", "v1")


def ids_of(samples: Any) -> list[str]:
    return [s["prompt_id"] for s in samples]


def test_open_by_url_splits_root_and_version(tmp_path: Path) -> None:
    assert split_url("s3://bucket/prefix/k26-v1/") == ("s3://bucket/prefix", "k26-v1")
    assert split_url("/data/v1") == ("/data", "v1")
    with pytest.raises(ValueError):
        split_url("s3://bucket/..")
    ShardStore(str(tmp_path), "v1").write_shard(0, 0, 0, rows("a"))
    for url in (f"{tmp_path}/v1", f"file://{tmp_path}/v1"):
        assert open_dataset(url).table()["prompt_id"].to_pylist() == ["a"]


def test_only_committed_shards_are_read(store: ShardStore) -> None:
    write(store, 0, 0, "a", "b")
    write(store, 1, 0, "c")
    write(store, 1, 5, "d")
    store.write_shard(2, 0, 3, [])  # a window of dead letters only: a marker, no shard
    Path(store.layout.marker(1, 5)).unlink()  # crashed between shard and marker
    reader = DatasetReader(store)
    assert [r.key for r in reader.shards()] == [(0, 0), (1, 0)]
    assert reader.table()["prompt_id"].to_pylist() == ["a", "b", "c"]
    assert ids_of(reader.stream()) == ["a", "b", "c"]
    assert reader.arrow_dataset().count_rows() == 3
    assert reader.table(["prompt_id"]).column_names == ["prompt_id"]


def test_a_sealed_version_is_its_manifest_less_the_excluded_rows(
    store: ShardStore, tmp_path: Path
) -> None:
    write(store, 0, 0, "a", "b", "c")
    write(store, 1, 0, "d", "e")
    write(store, 2, 0, "late")  # committed after the seal: not part of the version
    manifest = seal(store, {(0, 0): [1], (1, 0): []})
    reader = DatasetReader(store)
    assert reader.sealed() == manifest
    expected = ["a", "c", "d", "e"]
    assert reader.table()["prompt_id"].to_pylist() == expected
    assert ids_of(reader.stream()) == expected
    loaded = reader.hf_dataset(cache_dir=str(tmp_path / "hf-cache"))
    assert loaded["prompt_id"] == expected
    assert [list(x) for x in loaded["input_ids"]] == [
        list(x) for x in reader.table()["input_ids"].to_pylist()
    ]
    assert sorted((m.partition, m.start_offset) for m in reader.markers()) == [(0, 0), (1, 0)]


def test_samples_carry_token_arrays_and_the_other_columns(store: ShardStore) -> None:
    write(store, 0, 0, "abc")
    (sample,) = list(DatasetReader(store).stream())
    assert isinstance(sample["input_ids"], np.ndarray) and sample["input_ids"].dtype == np.int32
    assert sample["loss_mask"].tolist() == [0] * (len(sample["input_ids"]) - 2) + [1, 1]
    assert sample["input_ids"].tolist() == list(rows("abc")[0].input_ids)
    assert (sample["source"], sample["finish_reason"]) == ("src", "stop")


def test_a_shard_changed_under_the_reader_is_not_read_as_the_old_one(store: ShardStore) -> None:
    write(store, 0, 0, "a")
    reader = DatasetReader(store)
    (ref,) = reader.shards()
    Path(ref.path).write_bytes(Path(ref.path).read_bytes() + b"\0")
    with pytest.raises(ShardChanged):
        reader.read_shard(ref)
    with pytest.raises(ShardChanged):
        list(reader.stream(poll_s=0))  # listed again a few times, then an error, never skipped


def test_a_window_rewritten_while_streaming_is_read_as_rewritten(
    store: ShardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tokenize worker redoing an uncommitted window between the stream's listing and its
    read: the stream reads the new shard, per its new marker, once."""
    write(store, 0, 0, "a", "b")
    reader = DatasetReader(store)
    read = reader.read_shard
    rewrites = iter([True])

    def racing(ref: Any, columns: Any = None) -> Any:
        if next(rewrites, False):
            write(store, 0, 0, "a", "b", "c")
        return read(ref, columns)

    monkeypatch.setattr(reader, "read_shard", racing)
    assert ids_of(reader.stream(poll_s=0)) == ["a", "b", "c"]


@pytest.mark.parametrize("sealed", [False, True])
def test_ranks_and_workers_get_disjoint_shards_that_cover_the_version(
    store: ShardStore, sealed: bool
) -> None:
    everything = []
    for partition, start in itertools.product(range(5), (0, 100, 200)):
        ids = [f"p{partition}-{start}-{i}" for i in range(2)]
        write(store, partition, start, *ids)
        everything += ids
    if sealed:
        seal(store, {(m.partition, m.start_offset): [] for m in store.markers()})
    reader = DatasetReader(store)
    per_slot = [
        ids_of(reader.stream(rank, 2, worker=worker, num_workers=3))
        for rank in range(2)
        for worker in range(3)
    ]
    assert sorted(itertools.chain(*per_slot)) == sorted(everything)  # complete, no repeats
    if sealed:  # dealt round-robin: 15 shards over 6 slots, 2 or 3 each
        assert sorted(len(ids) // 2 for ids in per_slot) == [2, 2, 2, 3, 3, 3]
    else:  # by the hash of each key: spread, if less evenly
        assert all(per_slot)
    with pytest.raises(ValueError):
        reader.stream(2, 2).slot()


def test_the_slot_comes_from_torchrun_and_the_loader_worker(
    store: ShardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without torch installed: its worker info is read from a stand-in module."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    reader = DatasetReader(store)
    assert reader.stream().slot() == (1, 4)
    fake = types.ModuleType("torch.utils.data")
    info = types.SimpleNamespace(id=2, num_workers=3)
    fake.get_worker_info = lambda: info  # type: ignore[attr-defined]

    class IterableDataset:
        pass

    fake.IterableDataset = IterableDataset  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "torch.utils.data", fake)
    assert reader.stream().slot() == (1 * 3 + 2, 4 * 3)
    assert reader.stream(0, 1, worker=0, num_workers=1).slot() == (0, 1)  # explicit wins
    write(store, 0, 0, "a")
    wrapped = reader.stream(0, 1, worker=0, num_workers=1).as_torch()
    assert isinstance(wrapped, IterableDataset)
    assert ids_of(wrapped) == ["a"]
    # as a DataLoader started by spawn sends it to its workers
    assert ids_of(pickle.loads(pickle.dumps(wrapped))) == ["a"]


def test_follow_reads_shards_committed_later_until_sealed(store: ShardStore) -> None:
    write(store, 0, 0, "a")
    seen: list[str] = []
    stop = threading.Event()
    stream = DatasetReader(store).stream(follow=True, poll_s=0.02, stop=stop.is_set)

    def consume() -> None:
        for sample in stream:
            seen.append(sample["prompt_id"])

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    try:
        wait_for(lambda: seen == ["a"], 10, lambda: f"the first shard, seen {seen}")
        write(store, 3, 0, "b", "c")
        wait_for(lambda: seen == ["a", "b", "c"], 10, lambda: f"the later shard, seen {seen}")
        write(store, 1, 0, "d")
        seal(store, {(0, 0): [], (3, 0): [], (1, 0): []})  # the seal ends the stream
        thread.join(10)
        assert not thread.is_alive()
        assert seen == ["a", "b", "c", "d"]
    finally:
        stop.set()
        thread.join(10)


def test_follow_stops_when_asked_or_idle(store: ShardStore) -> None:
    write(store, 0, 0, "a")
    ticks = itertools.count()
    stream = DatasetReader(store).stream(
        follow=True, poll_s=1.0, idle_timeout_s=3.0, columns=["prompt_id"]
    )
    stream.clock = lambda: float(next(ticks))  # a fake clock: no real waiting
    stream.sleep = lambda _s: None
    assert ids_of(stream) == ["a"]
    calls = iter([False, True])
    stopped = DatasetReader(store).stream(follow=True, stop=lambda: next(calls))
    stopped.sleep = lambda _s: None
    assert ids_of(stopped) == ["a"]
