"""Source specs, row readers (JSONL, JSON, Parquet, directories, fsspec URLs, HF) and mixing."""

from __future__ import annotations

import gzip
import json
import re
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import producers.sources as sources
from producers.sources import (
    SOURCE_FORMATS,
    SourceFormat,
    SourceSpec,
    bundled_sample_path,
    iter_rows,
    mix_sources,
    parse_source_spec,
    row_error,
)
from streams.cli.main import build_parser
from streams.core.normalize import make_prompt_record, normalize_conversation, prompt_id


def prompt(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def rows_of(path: Path | str, **kwargs: Any) -> list[tuple[int, Any]]:
    return list(iter_rows(SourceSpec(str(path)), **kwargs))


# --- parse_source_spec ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "path", "weight"),
    [
        ("data/a.jsonl", "data/a.jsonl", None),
        ("data/a.jsonl:0.3", "data/a.jsonl", 0.3),
        ("  data/a.jsonl:2  ", "data/a.jsonl", 2.0),
        ("/abs/a.parquet:1e-2", "/abs/a.parquet", 0.01),
        ("a.jsonl:.5", "a.jsonl", 0.5),
        ("s3://bucket/x.jsonl", "s3://bucket/x.jsonl", None),
        ("s3://bucket/x.jsonl:0.3", "s3://bucket/x.jsonl", 0.3),
        ("s3://bucket/dir/:3", "s3://bucket/dir/", 3.0),
        ("http://host:8080/x.jsonl", "http://host:8080/x.jsonl", None),
        ("hf:org/name", "hf:org/name", None),
        ("hf:org/name:train", "hf:org/name:train", None),
        ("hf:org/name:train:0.25", "hf:org/name:train", 0.25),
        ("weird:name.jsonl", "weird:name.jsonl", None),
        ("x.jsonl:inf", "x.jsonl:inf", None),  # not digits: part of the path
    ],
)
def test_parse_source_spec(text: str, path: str, weight: float | None) -> None:
    assert parse_source_spec(text) == SourceSpec(path, weight)


@pytest.mark.parametrize(
    "text", ["", "   ", "a.jsonl:", ":0.5", "a.jsonl:0", "a.jsonl:-1", "a:0e0"]
)
def test_parse_source_spec_errors_are_one_line_value_errors(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_source_spec(text)
    assert "\n" not in str(info.value)


def test_source_spec_str_round_trips() -> None:
    for text in ["s3://b/x.jsonl:0.3", "hf:org/name:train", "a.jsonl"]:
        assert parse_source_spec(str(parse_source_spec(text))) == parse_source_spec(text)


# --- JSONL ---------------------------------------------------------------------------------------


def test_jsonl_rows_and_bad_lines_come_out_as_bytes(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(
        b'{"messages": [{"role": "user", "content": "one"}]}\n'
        b"\n"  # blank: skipped, but counted in row numbers
        b"{not json\n"
        b'{"messages": [{"role": "user", "content": "bad \xff utf8"}]}\n'
        b"[1, 2]\n"
        b'{"messages": [{"role": "user", "content": "last"}]}'  # no trailing newline
    )
    rows = rows_of(path)
    assert [number for number, _ in rows] == [0, 2, 3, 4, 5]
    assert rows[0][1] == prompt("one")
    assert rows[1][1] == b"{not json"
    assert rows[2][1] == b'{"messages": [{"role": "user", "content": "bad \xff utf8"}]}'
    assert rows[3][1] == b"[1, 2]"
    assert rows[4][1] == prompt("last")
    assert [row_error(raw).kind for _, raw in rows[1:4]] == [
        "not_json",
        "invalid_utf8",
        "bad_shape",
    ]


def test_jsonl_bom_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n{"b": 2}\r\n')
    assert rows_of(path) == [(0, {"a": 1}), (1, {"b": 2})]


def test_jsonl_gz(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(prompt("zipped")) + "\n" + "oops\n")
    assert rows_of(path) == [(0, prompt("zipped")), (1, b"oops")]


def test_jsonl_lines_longer_than_a_read_chunk(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(sources, "_READ_CHUNK", 7)
    rows = [prompt("x" * n) for n in (0, 1, 30, 3)]
    assert rows_of(write_jsonl(tmp_path / "p.jsonl", rows)) == list(enumerate(rows))


class _Chunked:
    def __init__(self, data: bytes, sizes: list[int]):
        self.data, self.sizes = data, sizes

    def read(self, _n: int) -> bytes:
        size = self.sizes.pop() if self.sizes else len(self.data)
        chunk, self.data = self.data[: max(size, 1)], self.data[max(size, 1) :]
        return chunk


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60), st.lists(st.integers(1, 9), max_size=20))
def test_line_splitter_matches_bytes_split(data: bytes, sizes: list[int]) -> None:
    expected = data.split(b"\n")
    if expected and expected[-1] == b"":
        expected.pop()
    assert list(sources._iter_lines(_Chunked(data, sizes))) == expected


# --- JSON array, Parquet -------------------------------------------------------------------------


def test_json_array_file(tmp_path: Path) -> None:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"}]}, 3]))
    assert rows_of(path) == [(0, {"conversations": [{"from": "human", "value": "hi"}]}), (1, b"3")]


def test_json_file_holding_json_lines(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "lines.json", [prompt("a"), prompt("b")])
    assert rows_of(path) == [(0, prompt("a")), (1, prompt("b"))]


def _write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=3)
    return path


def test_parquet_batches_and_nested_messages(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(sources, "_PARQUET_BATCH", 2)
    rows: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": f"q{i}"}], "n": i} for i in range(7)
    ]
    rows[0]["messages"] = [{"role": "user", "content": "q0", "name": "ana"}]
    out = rows_of(_write_parquet(tmp_path / "p.parquet", rows))
    assert [number for number, _ in out] == list(range(7))
    assert [row["n"] for _, row in out if isinstance(row, dict)] == list(range(7))
    # Arrow unifies struct fields, so every message now has `name`; normalization drops nulls.
    second = out[1][1]
    assert isinstance(second, dict)
    assert second["messages"] == [{"role": "user", "content": "q1", "name": None}]
    assert normalize_conversation(second) == ([{"role": "user", "content": "q1"}], None)


def test_same_prompt_from_jsonl_and_parquet_has_the_same_id(tmp_path: Path) -> None:
    rows = [
        {
            "messages": [
                {"role": "user", "content": "go", "tool_calls": None, "tool_call_id": None},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                    "tool_call_id": None,
                },
                {"role": "tool", "content": "r", "tool_calls": None, "tool_call_id": "c"},
            ]
        }
    ]
    (_, from_parquet), = rows_of(_write_parquet(tmp_path / "p.parquet", rows))  # fmt: skip
    (_, from_jsonl), = rows_of(write_jsonl(tmp_path / "p.jsonl", rows))  # fmt: skip
    assert prompt_id(*normalize_conversation(from_parquet)) == prompt_id(
        *normalize_conversation(from_jsonl)
    )


# --- directories, globs, URLs, errors ------------------------------------------------------------


def test_directory_of_files_in_sorted_order_with_running_row_numbers(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "b.jsonl", [prompt("b0"), prompt("b1")])
    _write_parquet(tmp_path / "a.parquet", [prompt("a0")])
    (tmp_path / "sub").mkdir()
    with gzip.open(tmp_path / "sub" / "c.jsonl.gz", "wt") as f:
        f.write(json.dumps(prompt("c0")) + "\n")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / ".hidden.jsonl").write_text("junk\n")
    (tmp_path / "notes.txt").write_text("not data\n")
    out = rows_of(tmp_path)
    texts = [row["messages"][0]["content"] for _, row in out if isinstance(row, dict)]
    assert texts == ["a0", "b0", "b1", "c0"]
    assert [number for number, _ in out] == [0, 1, 2, 3]


def test_glob(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "x-1.jsonl", [prompt("1")])
    write_jsonl(tmp_path / "x-2.jsonl", [prompt("2")])
    write_jsonl(tmp_path / "y.jsonl", [prompt("y")])
    assert [row for _, row in rows_of(tmp_path / "x-*.jsonl")] == [prompt("1"), prompt("2")]


def test_fsspec_url_memory_filesystem() -> None:
    root = f"memory://draftgen-test-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    with fs.open(f"{root}/p.jsonl", "wb") as f:
        f.write(b'{"messages": [{"role": "user", "content": "mem"}]}\nbad\n')
    with fs.open(f"{root}/q.parquet", "wb") as f:
        pq.write_table(pa.Table.from_pylist([prompt("pq")]), f)
    try:
        assert rows_of(f"{root}/p.jsonl") == [(0, prompt("mem")), (1, b"bad")]
        assert rows_of(f"{root}/q.parquet") == [(0, prompt("pq"))]
        assert [row for _, row in rows_of(root)] == [prompt("mem"), b"bad", prompt("pq")]
    finally:
        fs.rm(root, recursive=True)


def test_missing_or_unsupported_sources_fail_at_call_time(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        iter_rows(SourceSpec(str(tmp_path / "missing.jsonl")))
    with pytest.raises(FileNotFoundError):
        iter_rows(SourceSpec(str(tmp_path / "none-*.jsonl")))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="unsupported"):
        iter_rows(SourceSpec(str(tmp_path / "notes.txt")))


def _iter_toy(fs: Any, path: str) -> Any:
    """A toy format: a user turn a line; `!` is a bad row."""
    with fs.open(path, "rb") as f:
        for number, line in enumerate(f.read().decode().splitlines()):
            row = {"messages": [{"role": "user", "content": line}]}
            yield number, row if line != "!" else line.encode()


def test_a_registered_source_format_is_read_like_the_built_in_ones(tmp_path: Path) -> None:
    """A format is its reader plus one registration: files, directories and globs pick it up,
    its rows become the same prompts as JSONL's, and the error messages name it."""
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "a.toy").write_text("hello\n!\n")
    turn = {"messages": [{"role": "user", "content": "hello"}]}
    (folder / "b.jsonl").write_text(json.dumps(turn) + "\n")
    (tmp_path / "notes.txt").write_text("x")
    with SOURCE_FORMATS.registered("toy", SourceFormat((".toy",), _iter_toy)):
        rows = list(iter_rows(SourceSpec(str(folder))))
        assert rows == [(0, turn), (1, b"!"), (2, turn)]
        assert len(list(iter_rows(SourceSpec(str(folder / "*.toy"))))) == 2
        # what `publish` sends: the same prompt from either format is one prompt
        records = [make_prompt_record(row, "s", {}) for _, row in rows if isinstance(row, dict)]
        assert records[0].prompt_id == records[1].prompt_id
        spec = SourceSpec(str(folder / "a.toy"), 2.0)
        mixed = list(mix_sources([spec, SourceSpec(str(folder / "b.jsonl"), 1.0)], seed=1))
        assert sorted(number for source, number, _ in mixed if source == spec) == [0, 1]
        with pytest.raises(ValueError, match=r"notes.txt \(jsonl, json, parquet, toy\)"):
            iter_rows(SourceSpec(str(tmp_path / "notes.txt")))
        assert ".toy;" in publish_sources_help()
    with pytest.raises(ValueError, match=r"a.toy \(jsonl, json, parquet\)$"):
        iter_rows(SourceSpec(str(folder / "a.toy")))


def test_publish_names_every_registered_source_format() -> None:
    """`publish --help` names the registered formats (its parser reads the registry)."""
    help_text = publish_sources_help()
    for name, fmt in SOURCE_FORMATS.items():
        assert re.search(re.escape(fmt.extensions[0]) + r"\b", help_text), name


def publish_sources_help() -> str:
    parser = build_parser(["publish"])
    action = next(a for a in parser._actions if a.dest == "command")
    publish = action.choices["publish"]  # type: ignore[index]
    return next(a.help for a in publish._actions if a.dest == "sources") or ""


def test_bundled_sample_path_is_readable() -> None:
    path = bundled_sample_path()
    assert path.is_file() and path.suffix == ".jsonl"
    assert len(rows_of(path)) >= 35


# --- Hugging Face datasets -----------------------------------------------------------------------


@pytest.fixture
def datasets() -> Any:
    return pytest.importorskip("datasets")


def test_save_to_disk_dataset_and_dataset_dict(tmp_path: Path, datasets: Any) -> None:
    ds = datasets.Dataset.from_list([prompt("h0"), prompt("h1")])
    ds.save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": ds, "test": ds.select([1])}).save_to_disk(str(tmp_path / "two"))
    assert rows_of(tmp_path / "one") == [(0, prompt("h0")), (1, prompt("h1"))]
    assert rows_of(tmp_path / "two") == [(0, prompt("h0")), (1, prompt("h1"))]
    assert rows_of(f"hf:{tmp_path / 'two'}:test") == [(0, prompt("h1"))]
    with pytest.raises(ValueError, match="no split"):
        rows_of(f"hf:{tmp_path / 'two'}:validation")


def test_directory_of_other_data_files_goes_through_load_dataset(
    tmp_path: Path, datasets: Any
) -> None:
    (tmp_path / "data.csv").write_text("text,n\nhello,1\nworld,2\n")
    expected = [(0, {"text": "hello", "n": 1}), (1, {"text": "world", "n": 2})]
    assert rows_of(tmp_path) == expected
    assert rows_of(f"hf:{tmp_path}") == expected


def test_hub_names_are_streamed_with_the_split(monkeypatch: Any, datasets: Any) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    def fake_load_dataset(name: str, **kwargs: Any) -> list[dict[str, Any]]:
        calls.append((name, kwargs))
        return [prompt("hub")]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert rows_of("hf:org/name") == [(0, prompt("hub"))]
    assert rows_of("hf:org/name:test") == [(0, prompt("hub"))]
    assert [(name, kw["split"], kw["streaming"]) for name, kw in calls] == [
        ("org/name", "train", True),
        ("org/name", "test", True),
    ]


# --- mix_sources ---------------------------------------------------------------------------------


def make_sources(tmp_path: Path, sizes: dict[str, int]) -> dict[str, Path]:
    return {
        name: write_jsonl(tmp_path / f"{name}.jsonl", [prompt(f"{name}{i}") for i in range(n)])
        for name, n in sizes.items()
    }


def names(mixed: list[tuple[SourceSpec, int, Any]], paths: dict[str, Path]) -> list[str]:
    by_path = {str(path): name for name, path in paths.items()}
    return [by_path[spec.path] for spec, _, _ in mixed]


def test_without_weights_sources_are_read_in_order(tmp_path: Path) -> None:
    paths = make_sources(tmp_path, {"a": 2, "b": 3})
    specs = [SourceSpec(str(paths["a"])), SourceSpec(str(paths["b"]))]
    mixed = list(mix_sources(specs))
    assert names(mixed, paths) == ["a", "a", "b", "b", "b"]
    assert [number for _, number, _ in mixed] == [0, 1, 0, 1, 2]
    assert names(list(mix_sources(specs, limit=3)), paths) == ["a", "a", "b"]
    assert list(mix_sources(specs, limit=0)) == []


def test_weights_give_proportions_and_are_deterministic(tmp_path: Path) -> None:
    paths = make_sources(tmp_path, {"a": 1000, "b": 1000, "c": 1000})
    specs = [
        SourceSpec(str(paths["a"]), 0.6),
        SourceSpec(str(paths["b"]), 0.3),
        SourceSpec(str(paths["c"]), 0.1),
    ]
    mixed = list(mix_sources(specs, limit=1000, seed=7))
    counts = Counter(names(mixed, paths))
    assert len(mixed) == 1000
    assert abs(counts["a"] - 600) <= 2 and abs(counts["b"] - 300) <= 2
    assert abs(counts["c"] - 100) <= 2
    # every prefix tracks the weights too, so the mix is interleaved, not blocky
    first = Counter(names(mixed[:100], paths))
    assert abs(first["a"] - 60) <= 2 and abs(first["c"] - 10) <= 2
    # rows of each source come in order, and the whole mix is reproducible
    assert [n for spec, n, _ in mixed if spec == specs[1]] == list(range(counts["b"]))
    again = list(mix_sources(specs, limit=1000, seed=7))
    assert [(s, n) for s, n, _ in again] == [(s, n) for s, n, _ in mixed]
    other_seed = Counter(names(list(mix_sources(specs, limit=1000, seed=8)), paths))
    assert all(abs(other_seed[name] - counts[name]) <= 2 for name in counts)


def test_exhausted_sources_drop_out(tmp_path: Path) -> None:
    paths = make_sources(tmp_path, {"small": 5, "big": 100})
    specs = [SourceSpec(str(paths["small"]), 0.5), SourceSpec(str(paths["big"]), 0.5)]
    mixed = list(mix_sources(specs, limit=50))
    counts = Counter(names(mixed, paths))
    assert counts == {"small": 5, "big": 45}
    everything = list(mix_sources(specs))
    assert len(everything) == 105


def test_bad_rows_are_passed_through(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"oops\n")
    assert list(mix_sources([SourceSpec(str(path), 1.0)])) == [
        (SourceSpec(str(path), 1.0), 0, b"oops")
    ]


def test_mix_errors_fail_at_call_time(tmp_path: Path) -> None:
    paths = make_sources(tmp_path, {"a": 1})
    with pytest.raises(ValueError, match="every source or to none"):
        mix_sources([SourceSpec(str(paths["a"]), 1.0), SourceSpec(str(paths["a"]))])
    with pytest.raises(FileNotFoundError):
        mix_sources([SourceSpec(str(tmp_path / "missing.jsonl"))])
    with pytest.raises(ValueError, match="limit"):
        mix_sources([SourceSpec(str(paths["a"]))], limit=-1)


def test_stopping_early_closes_the_readers(tmp_path: Path, monkeypatch: Any) -> None:
    paths = make_sources(tmp_path, {"a": 10, "b": 10})
    opened: list[Any] = []

    def recording_iter_rows(spec: SourceSpec, storage_options: Any = None) -> Any:
        opened.append(iter_rows(spec, storage_options))
        return opened[-1]

    monkeypatch.setattr(sources, "iter_rows", recording_iter_rows)
    mixed = mix_sources([SourceSpec(str(paths["a"]), 1), SourceSpec(str(paths["b"]), 1)])
    next(mixed)
    next(mixed)
    assert all(it.gi_frame is not None for it in opened)
    mixed.close()  # type: ignore[attr-defined]
    assert len(opened) == 2 and all(it.gi_frame is None for it in opened)


def test_count_rows_is_what_the_readers_yield_where_a_format_can_count(tmp_path: Path) -> None:
    """publish's total: JSON lines on this disk (blank lines, a BOM, gzip) and Parquet by its
    footer; None for a format that cannot count without reading (a JSON array, the Hub)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_bytes(
        b"\xef\xbb\xbf" + b'{"prompt": "x"}\n\n  \nnot json\n{"prompt": "y"}'
    )
    with gzip.open(data / "b.jsonl.gz", "wt") as f:
        f.write(json.dumps(prompt("z")) + "\n\n")
    pq.write_table(pa.table({"prompt": [f"p{i}" for i in range(7)]}), data / "c.parquet")
    specs = [SourceSpec(str(data)), SourceSpec(str(data / "*.parquet"))]
    read = len(list(mix_sources(specs)))
    assert read == 3 + 1 + 7 + 7
    assert sources.count_rows(specs) == read
    array = tmp_path / "d.json"
    array.write_text(json.dumps([prompt("w")]))
    assert sources.count_rows([*specs, SourceSpec(str(array))]) is None
    assert sources.count_rows([SourceSpec("hf:org/name")]) is None
    # a remote file is not read twice to count it
    with fsspec.open("memory://count/e.jsonl", "wb") as f:
        f.write(b'{"prompt": "m"}\n')
    assert sources.count_rows([SourceSpec("memory://count/e.jsonl")]) is None
