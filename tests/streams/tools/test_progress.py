"""Dataset figures: what the committed markers of a version add up to."""

from __future__ import annotations

from pathlib import Path

from sinks.reader import DatasetReader
from sinks.shards import SampleRow, ShardStore
from streams.tools.progress import dataset_figures

PROMPT = "prompt: server '</think>' vs rendered '<|im_end|>'"
TURN = "turn: server '\\n' vs rendered '\\n\\n'"


def row(pid: str, cause: str | None = None) -> SampleRow:
    return SampleRow(
        pid, "s", [1, 2, 3], [0, 1, 1], "stop", "server", drift=bool(cause), drift_cause=cause
    )


def test_figures_sum_the_drift_causes_of_the_markers(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v1")
    store.write_shard(0, 0, 2, [row("a", PROMPT), row("b", TURN), row("c")])
    store.write_shard(1, 0, 1, [row("d", TURN), row("e", TURN)])
    figures = dataset_figures(store)
    assert (figures.compared, figures.drifted) == (5, 4)
    assert figures.drift_causes.most_common() == [(TURN, 3), (PROMPT, 1)]


def test_figures_count_the_samples_of_each_normalization_profile(tmp_path: Path) -> None:
    """Markers list each row's profile; a later answer of the same prompt replaces the row."""
    store = ShardStore(str(tmp_path), "v1")
    store.write_shard(0, 0, 1, [named("a", "sglang-0.5.11"), named("b", "sglang-0.5.11")])
    store.write_shard(0, 2, 2, [named("a", "sglang-0.5.23")])
    first = min(store.markers(0), key=lambda m: m.start_offset)
    assert first.row_normalizations == ["sglang-0.5.11", "sglang-0.5.11"]
    figures = dataset_figures(store)
    assert dict(figures.normalizations) == {"sglang-0.5.11": 1, "sglang-0.5.23": 1}


def named(prompt_id: str, profile: str) -> SampleRow:
    return SampleRow(prompt_id, "s", [1, 2], [0, 1], "stop", "server", normalization=profile)


def test_a_sealed_versions_figures_are_its_manifests_whatever_was_written_after(
    tmp_path: Path,
) -> None:
    store = ShardStore(str(tmp_path), "v1")
    store.write_shard(0, 0, 2, [row("a"), row("b")], drops={"c": "policy_length"})
    manifest = store.seal({0: 3})
    # a writer that did not know of the seal (one from before the fence)
    store.write_shard(0, 3, 4, [row("d"), row("e")])
    figures = dataset_figures(store)
    assert (figures.samples, figures.tokens, figures.drops) == (2, 6, {"c": "policy_length"})
    assert (manifest.samples, manifest.tokens) == (figures.samples, figures.tokens)
    assert DatasetReader(store).table().num_rows == figures.samples
