"""`draftgen export` read back with the library that consumes each format (JSON lines as
SpecForge reads them, `datasets.load_from_disk`, pyarrow's Parquet reader), checked against
the shards and against SpecForge's own rules for pre-tokenized rows."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import datasets
import pyarrow.parquet as pq
import pytest

from sinks.reader import DatasetReader
from sinks.shards import SampleRow, ShardStore
from streams.cli.main import main


def sample(pid: str, prompt: int, mask: list[int], source: str, finish: str) -> SampleRow:
    ids = list(range(1000 + prompt + len(mask)))[-(prompt + len(mask)) :]
    return SampleRow(pid, source, ids, [0] * prompt + mask, finish, "server")


ROWS = [
    sample("short", 3, [1, 1, 1], "chat", "stop"),
    sample("long", 6, [1] * 10, "code", "stop"),  # 16 tokens: cut to 8 keeps 2 loss tokens
    sample("long-prompt", 7, [1] * 5, "code", "tool_calls"),  # cut to 8 keeps 1: dropped
    sample("gappy", 2, [1, 0, 1, 0, 1], "chat", "stop"),  # no two adjacent supervised tokens
    sample("tools", 4, [1, 1], "code", "tool_calls"),
]


@pytest.fixture
def out(tmp_path: Path) -> str:
    store = ShardStore(str(tmp_path / "out"), "v1")
    store.write_manifest({"dataset": "v1"})
    store.write_shard(0, 0, 2, ROWS[:3])
    store.write_shard(1, 0, 1, ROWS[3:])
    return str(tmp_path / "out")


def export(out: str, fmt: str, output: Path, *flags: str) -> int:
    where = ["--out", out, "--dataset", "v1"]
    return main(["export", *where, "--format", fmt, "--output", str(output), *flags])


def specforge_keeps(row: SampleRow, max_length: int, min_loss_tokens: int = 2) -> dict | None:
    """SpecForge's pre-tokenized path for DFlash (specforge/data/prompt_builder.py and
    data/loss_mask.py): cut to max_length, then need `min_loss_tokens` supervised tokens and
    two adjacent ones."""
    ids, mask = list(row.input_ids)[:max_length], list(row.loss_mask)[:max_length]
    if sum(mask) < min_loss_tokens or not any(a and b for a, b in itertools.pairwise(mask)):
        return None
    return {"prompt_id": row.prompt_id, "input_ids": ids, "loss_mask": mask}


def test_specforge_jsonl_holds_exactly_the_rows_specforge_trains_on(
    out: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "train.jsonl"
    assert export(out, "specforge", path, "--max-seq-len", "8") == 0
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert set(lines[0]) == {"prompt_id", "input_ids", "loss_mask"}  # pre-tokenized to SpecForge
    expected = [kept for row in ROWS if (kept := specforge_keeps(row, 8)) is not None]
    assert lines == expected
    assert [line["prompt_id"] for line in lines] == ["short", "long", "tools"]
    printed = capsys.readouterr().out
    assert "exported 3 of 5" in printed and "min_loss_run 2" in printed
    assert "truncated 1" in printed


def test_min_loss_run_one_is_eagle3s_rule_and_drop_mode_drops_long_rows(
    out: str, tmp_path: Path
) -> None:
    path = tmp_path / "eagle.jsonl"
    assert export(out, "specforge", path, "--min-loss-run", "1") == 0
    assert [json.loads(x)["prompt_id"] for x in path.read_text().splitlines()] == [
        r.prompt_id for r in ROWS
    ]
    dropped = tmp_path / "drop.jsonl"
    assert export(out, "specforge", dropped, "--max-seq-len", "8", "--on-max-seq-len", "drop") == 0
    kept = [json.loads(x) for x in dropped.read_text().splitlines()]
    assert [k["prompt_id"] for k in kept] == ["short", "tools"]  # gappy: no adjacent pair


def test_hf_export_loads_from_disk_with_every_column(out: str, tmp_path: Path) -> None:
    path = tmp_path / "hf"
    assert export(out, "hf", path, "--source", "code", "--max-seq-len", "8") == 0
    loaded = datasets.load_from_disk(str(path))
    assert loaded["prompt_id"] == ["long", "tools"]
    shard_rows = {
        r["prompt_id"]: r for r in DatasetReader(ShardStore(out, "v1")).table().to_pylist()
    }
    first: dict[str, Any] = loaded[0]
    assert first["input_ids"] == shard_rows["long"]["input_ids"][:8]
    assert first["loss_mask"] == shard_rows["long"]["loss_mask"][:8]
    assert (first["num_tokens"], first["num_loss_tokens"], first["truncated"]) == (8, 2, True)
    assert loaded[1]["truncated"] is False
    assert loaded[1]["input_ids"] == shard_rows["tools"]["input_ids"]
    assert set(loaded.column_names) >= {"source", "finish_reason", "token_source", "drift"}


def test_parquet_export_filters_by_finish_reason_and_length(out: str, tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    flags = ("--finish-reason", "tool_calls", "--finish-reason", "stop", "--min-len", "6")
    assert export(out, "parquet", path, *flags, "--max-len", "12", "--min-loss-run", "1") == 0
    table = pq.read_table(path)
    # short (6 tokens) and tools (6) and long-prompt (12) and gappy (7); long (16) is too long
    assert sorted(table["prompt_id"].to_pylist()) == ["gappy", "long-prompt", "short", "tools"]
    source = {r.prompt_id: r for r in ROWS}
    for row in table.to_pylist():
        assert row["input_ids"] == list(source[row["prompt_id"]].input_ids)
        assert row["num_loss_tokens"] == sum(source[row["prompt_id"]].loss_mask)
    only_tools = tmp_path / "tools.parquet"
    assert export(out, "parquet", only_tools, "--finish-reason", "tool_calls") == 0
    assert pq.read_table(only_tools)["prompt_id"].to_pylist() == ["long-prompt", "tools"]


def test_an_existing_output_or_a_missing_version_is_one_line(
    out: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text("keep me\n")
    assert export(out, "specforge", path) == 2
    assert path.read_text() == "keep me\n"
    assert "exists" in capsys.readouterr().err
    assert main(["export", "--out", out, "--dataset", "nope", "--format", "hf",
                 "--output", str(tmp_path / "x")]) == 2  # fmt: skip
    assert "no dataset version 'nope'" in capsys.readouterr().err
