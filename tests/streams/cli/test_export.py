"""`draftgen export` read back with the library that consumes each format (JSON lines as
SpecForge reads them, `datasets.load_from_disk`, pyarrow's Parquet reader), checked against
the shards and against SpecForge's own rules for pre-tokenized rows."""

from __future__ import annotations

import itertools
import json
import re
import tracemalloc
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from sinks.reader import DatasetReader
from sinks.shards import SampleRow, ShardStore
from streams.cli.main import build_parser, main
from streams.tools.export_formats import EXPORT_FORMATS, ExportFormat
from streams.tools.export_parts import Part
from streams.tools.export_writers import Writer

DATA_MD = Path(__file__).resolve().parents[3] / "docs" / "data.md"


def sample(pid: str, prompt: int, mask: list[int], source: str, finish: str) -> SampleRow:
    ids = list(range(1000 + prompt + len(mask)))[-(prompt + len(mask)) :]
    provenance = f'{{"recipe":"mix","sampling":{{"temperature":0.6}},"source":"{source}"}}'
    row = SampleRow(pid, source, ids, [0] * prompt + mask, finish, "server")
    row.provenance = provenance
    return row


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
    return main(["export", *where, "--format", fmt, "--to", str(output), *flags])


def specforge_keeps(row: SampleRow, max_length: int, min_loss_tokens: int = 2) -> dict | None:
    """SpecForge's pre-tokenized path for DFlash (specforge/data/prompt_builder.py and
    data/loss_mask.py): cut to max_length, then need `min_loss_tokens` supervised tokens and
    two adjacent ones."""
    ids, mask = list(row.input_ids)[:max_length], list(row.loss_mask)[:max_length]
    if sum(mask) < min_loss_tokens or not any(a and b for a, b in itertools.pairwise(mask)):
        return None
    return {
        "prompt_id": row.prompt_id,
        "input_ids": ids,
        "loss_mask": mask,
        "provenance": row.provenance,
    }


def test_specforge_jsonl_holds_exactly_the_rows_specforge_trains_on(
    out: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "train.jsonl"
    assert export(out, "specforge", path, "--max-seq-len", "8") == 0
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    # pre-tokenized to SpecForge, which ignores the other fields
    assert set(lines[0]) == {"prompt_id", "input_ids", "loss_mask", "provenance"}
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
                 "--to", str(tmp_path / "x")]) == 2  # fmt: skip
    assert "no dataset version 'nope'" in capsys.readouterr().err


# -- the formats: one registry ---------------------------------------------------------------


class CsvPart(Part):
    def __init__(self, path: Path):
        self.handle = path.open("w")

    def _write(self, table: pa.Table) -> None:
        ids, lengths = table["prompt_id"].to_pylist(), table["num_tokens"].to_pylist()
        self.handle.writelines(f"{pid},{n}\n" for pid, n in zip(ids, lengths, strict=True))

    def _flush(self) -> None:
        self.handle.flush()

    def _close(self) -> None:
        self.handle.close()


class CsvWriter(Writer):
    """A toy format, defined and registered in this test only: prompt id and length, as CSV."""

    suffix = ".csv"

    def open_part(self, path: Path) -> Part:
        return CsvPart(path)


def test_a_registered_export_format_is_offered_checked_and_written(
    out: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A format is its writer plus one registration: `--format` offers it with its help, the
    rules choose its rows and the split names its parts, with no other change."""
    toy = ExportFormat("prompt ids and lengths as CSV", lambda: CsvWriter)
    path, split = tmp_path / "toy.csv", tmp_path / "toy-split"
    with EXPORT_FORMATS.registered("toy", toy):
        with pytest.raises(SystemExit):
            main(["export", "--help"])
        assert "toy: prompt ids and lengths as CSV" in " ".join(capsys.readouterr().out.split())
        assert export(out, "toy", path, "--max-seq-len", "8") == 0
        assert export(out, "toy", split, "--max-seq-len", "8", "--rows-per-file", "2") == 0
    kept = [k for row in ROWS if (k := specforge_keeps(row, 8))]
    expected = [f"{k['prompt_id']},{len(k['input_ids'])}" for k in kept]
    assert path.read_text().splitlines() == expected
    assert sorted(p.name for p in split.iterdir()) == ["part-00000.csv", "part-00001.csv"]
    assert [line for p in sorted(split.iterdir()) for line in p.read_text().splitlines()] == (
        expected
    )
    # unregistered again: refused like any unknown format
    with pytest.raises(SystemExit) as refused:
        export(out, "toy", tmp_path / "again.csv")
    assert refused.value.code == 2 and "invalid choice: 'toy'" in capsys.readouterr().err


def test_the_command_and_the_docs_offer_exactly_the_registered_formats() -> None:
    """`--format`'s choices come from `EXPORT_FORMATS`; docs/data.md's table of formats is
    written by hand and must say each one's help line, in the registry's order."""
    argv = ["export", "--format", "x"]
    action = next(a for a in build_parser(argv)._actions if a.dest == "command")
    export_parser = action.choices["export"]  # type: ignore[index]
    offered = next(a.choices for a in export_parser._actions if a.dest == "format")
    assert list(offered or ()) == list(EXPORT_FORMATS)
    table = re.findall(r"^\| `--format (\w+)` \| (.*) \|$", DATA_MD.read_text(), re.MULTILINE)
    assert table == [(name, entry.help) for name, entry in EXPORT_FORMATS.items()], (
        "docs/data.md's table of export formats"
    )


# -- exports at full size: split files, one shard at a time ------------------------------------


def many_shards(tmp_path: Path, shards: int = 12, rows: int = 7, long: int = 0) -> str:
    """A version of `shards` shards on 3 partitions, rows of varying length (`long` more
    supervised tokens each)."""
    store = ShardStore(str(tmp_path / "big"), "v1")
    store.write_manifest({"dataset": "v1"})
    for shard in range(shards):
        block = [
            sample(f"p{shard}-{i}", 2 + (shard * rows + i) % 9, [1] * (2 + i % 5 + long), "c", "s")
            for i in range(rows)
        ]
        store.write_shard(shard % 3, (shard // 3) * rows, (shard // 3) * rows + rows - 1, block)
    return str(tmp_path / "big")


def read_part(fmt: str, path: Path) -> list[dict[str, Any]]:
    if fmt == "specforge":
        return [json.loads(line) for line in path.read_text().splitlines()]
    return pq.read_table(path).to_pylist()


@pytest.mark.parametrize("fmt", ["specforge", "parquet"])
def test_split_files_hold_at_most_the_rows_and_tokens_and_together_the_unsplit_export(
    fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = many_shards(tmp_path)
    suffix = ".jsonl" if fmt == "specforge" else ".parquet"
    whole = tmp_path / f"whole{suffix}"
    assert export(out, fmt, whole, "--max-seq-len", "9") == 0
    expected = read_part(fmt, whole)
    assert len(expected) == 57  # of 84: the cut leaves 27 without two supervised tokens
    for flags, rows_cap, tokens_cap in [
        (("--rows-per-file", "10"), 10, None),
        (("--tokens-per-file", "60"), None, 60),
        (("--rows-per-file", "5", "--tokens-per-file", "40"), 5, 40),
    ]:
        split = tmp_path / f"split-{'-'.join(flags)}"
        assert export(out, fmt, split, "--max-seq-len", "9", *flags) == 0
        parts = sorted(split.iterdir())
        assert [p.name for p in parts] == [f"part-{i:05d}{suffix}" for i in range(len(parts))]
        union: list[dict[str, Any]] = []
        for index, part in enumerate(parts):
            rows = read_part(fmt, part)
            tokens = sum(len(row["input_ids"]) for row in rows)
            assert rows, part
            if rows_cap is not None:
                assert len(rows) <= rows_cap
            if tokens_cap is not None:
                assert tokens <= tokens_cap
                if index < len(parts) - 1:  # a part ends only when the next row does not fit
                    following = read_part(fmt, parts[index + 1])[0]
                    full = rows_cap is not None and len(rows) == rows_cap
                    assert full or tokens + len(following["input_ids"]) > tokens_cap
            union.extend(rows)
        assert union == expected
        assert f"{len(parts)} files" in capsys.readouterr().out


def test_hf_split_is_one_save_to_disk_directory_of_bounded_data_files(tmp_path: Path) -> None:
    out = many_shards(tmp_path)
    whole, split = tmp_path / "hf-whole", tmp_path / "hf-split"
    assert export(out, "hf", whole) == 0
    assert export(out, "hf", split, "--tokens-per-file", "100") == 0
    files = sorted(split.glob("data-*.arrow"))
    assert len(files) > 5
    assert [f.name for f in files] == [
        f"data-{i:05d}-of-{len(files):05d}.arrow" for i in range(len(files))
    ]
    for path in files:
        with pa.ipc.open_stream(pa.OSFile(str(path))) as stream:
            part = stream.read_all()
        assert 0 < pc.sum(part["num_tokens"]).as_py() <= 100
    assert (
        datasets.load_from_disk(str(split)).to_list()
        == datasets.load_from_disk(str(whole)).to_list()
    )


class CountingReader(DatasetReader):
    """Notes, at each shard it reads, the Arrow memory in use and the rows already written."""

    def __init__(self, store: ShardStore, output: Path):
        super().__init__(store)
        self.output = output
        self.allocated: list[int] = []
        self.written: list[int] = []
        self.largest = 0

    def read_shard(self, ref: Any, columns: Any = None) -> pa.Table:
        # a shard's buffers are Python bytes (traced) or Arrow's pool (counted)
        self.allocated.append(tracemalloc.get_traced_memory()[0] + pa.total_allocated_bytes())
        parent = self.output.parent
        self.written.append(sum(p.stat().st_size for p in parent.rglob("*") if p.is_file()))
        table = super().read_shard(ref, columns)
        self.largest = max(self.largest, table.nbytes)
        return table


# every registered format that reads the shards alone (a join with the completions topic needs
# a broker: tests/integration/test_export_conversations.py)
SHARD_FORMATS = [name for name, fmt in EXPORT_FORMATS.items() if not fmt.needs_completions]


@pytest.mark.parametrize("fmt", SHARD_FORMATS)
def test_export_reads_and_writes_shard_by_shard(fmt: str, tmp_path: Path) -> None:
    """Memory stays one shard whatever the version's size: after the first shards the memory in
    use when a shard is read grows by less than two shards, over 19 more shards, and each
    shard's rows are on disk before the next shard is read (nothing collects the version)."""
    from streams.tools.export import ExportRules, FileSplit
    from streams.tools.export import export as run_export
    from streams.tools.export_formats import open_writer

    out = many_shards(tmp_path, shards=24, rows=50, long=600)
    output = tmp_path / "exported" / f"v1.{fmt}"
    reader = CountingReader(ShardStore(out, "v1"), output)
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0] + pa.total_allocated_bytes()
        summary = run_export(reader, open_writer(fmt, output), ExportRules(), FileSplit(rows=500))
    finally:
        tracemalloc.stop()
    assert summary.written == 1200 and len(reader.allocated) == 24
    assert reader.largest > 150_000  # ~30k tokens a shard: the shards' data dominates
    steady = reader.allocated[4]
    assert max(reader.allocated[5:]) - steady < 2 * reader.largest, (baseline, reader.allocated)
    growth = [b - a for a, b in itertools.pairwise(reader.written)]
    assert all(step > 0 for step in growth[1:]), growth


def test_bad_split_flags_and_conversations_without_a_broker_are_one_line(
    out: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DRAFTGEN_BOOTSTRAP", raising=False)
    monkeypatch.delenv("DRAFTGEN_KAFKA_BOOTSTRAP", raising=False)
    for flag, value in [("--rows-per-file", "0"), ("--tokens-per-file", "x")]:
        with pytest.raises(SystemExit) as exited:  # argparse's own exit, one line
            export(out, "specforge", tmp_path / "a", flag, value)
        assert exited.value.code == 2
        assert flag in capsys.readouterr().err
    assert export(out, "conversations", tmp_path / "c.jsonl") == 2
    err = capsys.readouterr().err
    assert "--bootstrap" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists() and not (tmp_path / "c.jsonl").exists()
