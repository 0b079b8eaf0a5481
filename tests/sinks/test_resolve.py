"""Resolution of written windows (sinks/resolve.py): fencing by epoch, latest answer wins.

Pure: hand-made markers, no storage.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinks.marker import ShardMarker
from sinks.resolve import Resolution, resolve, resolve_partitions


def marker(
    start: int,
    end: int,
    epoch: int = 0,
    written_at: float = 0.0,
    rows: Iterable[str] = (),
    drops: dict[str, str] | None = None,
    partition: int = 0,
) -> ShardMarker:
    ids = list(rows)
    return ShardMarker(
        partition=partition,
        start_offset=start,
        end_offset=end,
        rows=len(ids),
        tokens=0,
        loss_tokens=0,
        sha256="",
        prompt_ids=ids,
        written_at=written_at,
        epoch=epoch,
        drops=dict(drops or {}),
    )


def bounds(markers: Iterable[ShardMarker]) -> list[tuple[int, int, int, int]]:
    return [(m.partition, m.start_offset, m.end_offset, m.epoch) for m in markers]


def assert_no_overlap(resolution: Resolution) -> None:
    by_partition: dict[int, list[ShardMarker]] = {}
    for m in resolution.windows:
        by_partition.setdefault(m.partition, []).append(m)
    for windows in by_partition.values():
        assert windows == sorted(windows, key=lambda m: m.start_offset)  # in offset order
        for left, right in itertools.pairwise(windows):
            assert left.end_offset < right.start_offset, (left, right)


# -- fencing ---------------------------------------------------------------------------------

# the new owner (epoch 2) adopted partition 0 at offset 10 and wrote [10, 19], [20, 29]
NEW_OWNER = [marker(10, 19, 2, written_at=5.0), marker(20, 29, 2, written_at=6.0)]


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (10, 19),  # the same bounds
        (10, 12),  # shorter, same start
        (10, 40),  # longer, same start
        (15, 25),  # starting inside, across both windows
        (12, 14),  # inside one window
        (25, 60),  # starting inside the last window, reaching past it
        (29, 35),  # starting at the last window's last offset
    ],
)
def test_a_zombie_window_of_an_older_generation_is_superseded_whatever_its_bounds(
    start: int, end: int
) -> None:
    committed = marker(0, 9, 1, written_at=1.0)  # the zombie's, before the rebalance
    zombie = marker(start, end, 1, written_at=9.0)  # written after the new owner's windows
    resolution = resolve([committed, *NEW_OWNER, zombie])
    assert resolution.windows == [committed, *NEW_OWNER]
    assert resolution.superseded == [zombie]


def test_with_equal_generations_the_window_written_later_wins() -> None:
    # a restart with static membership keeps its epoch and rewrites from the committed
    # offset: its windows end elsewhere than the first write's
    first = marker(0, 9, 3, written_at=1.0)
    second = [marker(0, 4, 3, written_at=2.0), marker(5, 12, 3, written_at=3.0)]
    resolution = resolve([first, *second])
    assert resolution.windows == second
    assert resolution.superseded == [first]

    earlier = [marker(0, 4, 3, written_at=1.0), marker(5, 12, 3, written_at=2.0)]
    later = marker(0, 9, 3, written_at=3.0)
    resolution = resolve([*earlier, later])
    assert resolution.windows == [later]
    assert sorted(bounds(resolution.superseded)) == [(0, 0, 4, 3), (0, 5, 12, 3)]


def test_windows_of_older_generations_count_when_nothing_newer_overlaps_them() -> None:
    markers = [
        marker(0, 9, 1),
        marker(10, 19, 4),
        marker(20, 29, 2),  # older than its left neighbour, overlapping nothing
        marker(10, 19, 1, partition=1),  # partitions are resolved independently
        marker(30, 39, 0),
    ]
    resolution = resolve(markers)
    assert bounds(resolution.windows) == [
        (0, 0, 9, 1),
        (0, 10, 19, 4),
        (0, 20, 29, 2),
        (0, 30, 39, 0),
        (1, 10, 19, 1),
    ]
    assert resolution.superseded == []


def test_windows_that_count_never_overlap_and_cover_what_they_cover() -> None:
    markers = [
        # epoch 1 wrote [0, 29]; only [0, 9] was committed
        marker(0, 9, 1, written_at=1.0),
        marker(10, 19, 1, written_at=2.0),
        marker(20, 29, 1, written_at=3.0),
        # epoch 2 adopted at 10 and committed [10, 14]; [15, 24] was not committed
        marker(10, 14, 2, written_at=4.0),
        marker(15, 24, 2, written_at=5.0),
        # epoch 3 adopted at 15 and wrote [15, 17]
        marker(15, 17, 3, written_at=6.0),
        # epoch 2, a zombie now, wrote one more window after that
        marker(25, 40, 2, written_at=7.0),
    ]
    resolution = resolve(markers)
    assert_no_overlap(resolution)
    assert bounds(resolution.windows) == [
        (0, 0, 9, 1),
        (0, 10, 14, 2),
        (0, 15, 17, 3),
        (0, 25, 40, 2),  # not overlapped (yet): epoch 3 has not written past 17
    ]
    assert sorted(bounds(resolution.superseded)) == [
        (0, 10, 19, 1),
        (0, 15, 24, 2),
        (0, 20, 29, 1),
    ]


# -- latest answer wins ------------------------------------------------------------------------


def test_a_later_row_of_a_prompt_excludes_the_earlier_one() -> None:
    first = marker(0, 2, rows=["a", "b", "c"])
    second = marker(3, 4, rows=["d", "b"])
    third = marker(5, 5, rows=["b"])
    resolution = resolve([third, first, second])  # the listing order does not matter
    assert resolution.exclude == {first.key: [1], second.key: [1]}
    assert resolution.samples == {"a", "b", "c", "d"}
    assert resolution.drops == {}
    assert [resolution.kept_rows(m) for m in (first, second, third)] == [2, 1, 1]


def test_a_later_drop_of_a_prompt_is_its_outcome_and_excludes_its_row() -> None:
    first = marker(0, 1, rows=["a", "b"])
    second = marker(2, 3, rows=["c"], drops={"a": "policy_length"})
    resolution = resolve([first, second])
    assert resolution.drops == {"a": "policy_length"}
    assert resolution.samples == {"b", "c"}
    assert resolution.exclude == {first.key: [0]}
    assert resolution.prompt_ids == {"a", "b", "c"}


def test_a_later_row_of_a_dropped_prompt_is_its_outcome() -> None:
    first = marker(0, 1, rows=["b"], drops={"a": "template_error"})
    second = marker(2, 2, rows=["a"])
    resolution = resolve([first, second])
    assert resolution.samples == {"a", "b"}
    assert resolution.drops == {}
    assert resolution.exclude == {}


def test_rows_and_drops_of_superseded_windows_are_no_outcome() -> None:
    kept = marker(0, 4, 2, rows=["a"])
    zombie = marker(0, 9, 1, written_at=9.0, rows=["a", "z"], drops={"y": "bad_shape"})
    resolution = resolve([kept, zombie])
    assert resolution.samples == {"a"}
    assert resolution.drops == {}
    assert resolution.exclude == {}


# -- property: owners rewriting from the committed offset, zombies writing late ----------------


@dataclass
class Writer:
    epoch: int
    position: int  # the next offset it writes
    alive: bool = True
    acked: int = 0  # the end of its acked windows: where the next commit moves to
    written: list[tuple[int, int, int]] = field(default_factory=list)  # keys since adoption


@dataclass(frozen=True)
class Write:
    which: int  # which alive writer
    length: int
    rows: list[str]
    drops: list[str]


@dataclass(frozen=True)
class Commit:
    """The current owner's acked offsets are committed."""


@dataclass(frozen=True)
class Rebalance:
    """A new epoch adopts at the committed offset; the old owner may live on as a zombie."""

    zombie: bool
    remove: bool  # the adoption removes markers (the sink does; resolution must not need it)


@dataclass(frozen=True)
class Restart:
    """A crash and a restart with static membership: the same epoch."""

    remove: bool


PROMPTS = st.lists(st.sampled_from("abcdef"), max_size=3, unique=True)
STEPS = st.lists(
    st.one_of(
        st.builds(Write, st.integers(0, 7), st.integers(1, 8), PROMPTS, PROMPTS),
        st.builds(Commit),
        st.builds(Rebalance, st.booleans(), st.booleans()),
        st.builds(Restart, st.booleans()),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(STEPS)
def test_windows_that_count_never_overlap_and_cover_every_committed_offset_once(
    steps: list[Write | Commit | Rebalance | Restart],
) -> None:
    current = Writer(epoch=1, position=0)
    writers = [current]
    committed = 0  # the group's committed offset
    markers: dict[tuple[int, int, int], ShardMarker] = {}  # by key: a rewrite replaces
    committed_keys: set[tuple[int, int, int]] = set()
    clock = 0.0

    def adopt(epoch: int, remove: bool) -> Writer:
        if remove:
            for key, m in list(markers.items()):
                if m.start_offset >= committed and m.epoch <= epoch:
                    del markers[key]
        writer = Writer(epoch, committed, acked=committed)
        writers.append(writer)
        return writer

    for step in steps:
        clock += 1.0
        if isinstance(step, Write):
            alive = [w for w in writers if w.alive]
            writer = alive[step.which % len(alive)]
            drops = {pid: "policy_length" for pid in step.drops if pid not in step.rows}
            start, end = writer.position, writer.position + step.length - 1
            m = marker(start, end, writer.epoch, clock, step.rows, drops)
            markers[m.key] = m
            writer.position = end + 1
            if writer is current:
                writer.acked = end + 1
                writer.written.append(m.key)
        elif isinstance(step, Commit):
            if current.alive:
                committed = current.acked
                committed_keys.update(current.written)
        elif isinstance(step, Rebalance):
            current.alive = step.zombie
            current = adopt(current.epoch + 1, step.remove)
        else:
            current.alive = False
            current = adopt(current.epoch, step.remove)

    resolution = resolve(markers.values())
    assert_no_overlap(resolution)
    assert sorted(bounds(resolution.windows + resolution.superseded)) == sorted(
        bounds(markers.values())
    )
    covering = [
        sum(m.start_offset <= offset <= m.end_offset for m in resolution.windows)
        for offset in range(committed)
    ]
    assert covering == [1] * committed
    # what was committed is what counts: a committed window is never superseded
    assert committed_keys <= {m.key for m in resolution.windows}

    # latest answer wins: each prompt's outcome is its last one in offset order
    outcome: dict[str, str | None] = {}  # prompt → None for a row, the kind for a drop
    for m in resolution.windows:
        outcome.update(dict.fromkeys(m.prompt_ids))
        outcome.update(m.drops)
    assert resolution.samples == {pid for pid, kind in outcome.items() if kind is None}
    assert resolution.drops == {pid: kind for pid, kind in outcome.items() if kind is not None}
    assert not resolution.samples & set(resolution.drops)
    kept = [
        pid
        for m in resolution.windows
        for index, pid in enumerate(m.prompt_ids)
        if index not in resolution.exclude.get(m.key, [])
    ]
    assert sorted(kept) == sorted(resolution.samples)  # one row per sample


# -- one partition at a time ------------------------------------------------------------------

# windows of three partitions: rows and drops of prompts keyed to one partition each (a prompt
# id's first letter names its partition), some answered again later, some windows superseded
PARTITIONED = st.lists(
    st.tuples(
        st.integers(0, 2),  # partition
        st.integers(0, 20),  # start
        st.integers(0, 4),  # length - 1
        st.integers(0, 2),  # epoch
        st.lists(st.sampled_from("0123"), max_size=4, unique=True),  # rows
        st.lists(st.sampled_from("0123"), max_size=2, unique=True),  # drops
    ),
    max_size=25,
)


def _partitioned(windows: list[tuple[int, int, int, int, list[str], list[str]]]) -> list:
    markers = {}
    for at, (partition, start, length, epoch, rows, drops) in enumerate(windows):
        ids = [f"{partition}-{r}" for r in rows]
        dropped = {f"{partition}-{d}": "policy_length" for d in drops if d not in rows}
        m = marker(start, start + length, epoch, float(at), ids, dropped, partition)
        markers[m.key] = m
    by_partition: dict[int, list[ShardMarker]] = {}
    for m in markers.values():
        by_partition.setdefault(m.partition, []).append(m)
    return [by_partition[p] for p in sorted(by_partition)]


@settings(max_examples=300, deadline=None)
@given(PARTITIONED, st.booleans())
def test_resolving_a_partition_at_a_time_gives_what_resolving_all_at_once_gives(
    windows: list[tuple[int, int, int, int, list[str], list[str]]], cut: bool
) -> None:
    partitions = _partitioned(windows)
    committed = {0: 12, 1: 5} if cut else None
    whole = resolve([m for markers in partitions for m in markers], committed)
    kept = resolve_partitions(iter(partitions), committed)
    light = resolve_partitions(iter(partitions), committed, keep_ids=False)
    assert kept is not None and light is not None
    for part in (kept, light):
        assert bounds(part.windows) == bounds(whole.windows)
        assert bounds(part.superseded) == bounds(whole.superseded)
        assert part.exclude == whole.exclude
        assert part.drops == whole.drops
        assert part.sample_count == len(whole.samples)
    assert kept.windows == whole.windows and kept.samples == whole.samples
    # without the ids: no per-row lists, but the row tokens a figure needs for excluded rows
    assert light.samples == set()
    assert all(not m.prompt_ids for m in light.windows + light.superseded)


def test_a_prompt_with_outcomes_in_two_partitions_is_left_to_resolving_all_at_once() -> None:
    # possible only after the topic's partition count changed: a prompt's key moved
    first = marker(0, 1, rows=["a"], partition=0)
    moved = marker(0, 1, rows=["a"], partition=1)
    assert resolve_partitions(iter([[first], [moved]])) is None
    assert resolve([first, moved]).exclude == {first.key: [0]}
