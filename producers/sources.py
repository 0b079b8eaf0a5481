"""Prompt sources: parse `path[:weight]` specs, read rows from files or datasets, mix sources.

A source is one of
- a file of a registered source format (``SOURCE_FORMATS``, below: JSON lines, a JSON array
  loaded whole, Parquet), optionally compressed (``.gz``/``.bz2``/``.xz``…), on any fsspec URL
  (local path, ``s3://``, …);
- a directory or glob of such files (read in sorted path order);
- a directory written by ``datasets``' ``save_to_disk``, or a directory of other data files that
  ``datasets.load_dataset`` understands (CSV, Arrow, …);
- a Hugging Face Hub dataset: ``hf:org/name`` or ``hf:org/name:split`` (streamed, split
  defaults to ``train``).

The last two are read by ``datasets`` (``producers/hf_datasets.py``).

Rows are ``(row_number, row)``: row numbers are 0-based (the line index in JSONL, blank lines
counted; the row index otherwise) and run on across the files of a directory. A row that is not
a JSON object comes out as its raw bytes so the caller can dead-letter it; reading never stops
on a bad row.

A file format is a reader (``read(fs, path)`` yielding those rows) and its file name endings,
registered once in ``SOURCE_FORMATS``: directories, globs and the error messages follow it.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import fsspec
import orjson
import pyarrow.parquet as pq
from fsspec.utils import infer_compression

from producers.hf_datasets import is_saved_dataset, iter_hf, iter_load_dataset, iter_saved_dataset
from streams.core.recipes import SourceRecipe
from streams.core.records import RecordError
from streams.core.registry import Registry

Row = dict[str, Any] | bytes

HF_PREFIX = "hf:"
_COMPRESSION_EXTS = (".gz", ".bz2", ".xz", ".lzma", ".zst")
_READ_CHUNK = 1 << 20
_PARQUET_BATCH = 1024
# A trailing `:weight`; digits only, so `:inf`, `:nan` or `:train` stay part of the path.
_WEIGHT = re.compile(r"^(?P<path>.*):(?P<weight>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)$")


@dataclass(frozen=True)
class SourceSpec:
    path: str
    weight: float | None = None
    # how its prompts are generated (producers/recipes.py); None: the flags'
    recipe: SourceRecipe | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return self.path if self.weight is None else f"{self.path}:{self.weight:g}"


def source_name(spec: SourceSpec) -> str:
    """What the data calls a source: its file (or directory, or glob) name, or the `hf:` spec;
    never a path of the publishing machine."""
    if spec.path.startswith(HF_PREFIX):
        return spec.path
    return PurePosixPath(spec.path.rstrip("/")).name or spec.path


def parse_source_spec(text: str) -> SourceSpec:
    """Parse ``path[:weight]``; the weight is a trailing ``:number`` > 0.

    ``s3://bucket/x.jsonl:0.3`` → (``s3://bucket/x.jsonl``, 0.3); ``hf:org/name:train`` keeps
    ``:train`` as the split; ``hf:org/name:train:2`` has weight 2.
    """
    text = text.strip()
    if not text:
        raise ValueError("empty source spec")
    if text.endswith(":"):
        raise ValueError(f"source spec {text!r} ends with ':' but gives no weight")
    match = _WEIGHT.match(text)
    if match is None:
        return SourceSpec(text, None)
    path, weight = match["path"], float(match["weight"])
    if not path or path.endswith(":"):
        raise ValueError(f"source spec {text!r} has no path before the weight")
    if not (weight > 0 and math.isfinite(weight)):
        raise ValueError(f"source spec {text!r}: weight must be a positive number")
    return SourceSpec(path, weight)


def bundled_sample_path() -> Path:
    """The hand-written sample prompts shipped with the package (a JSONL file)."""
    return Path(__file__).parent / "samples" / "sample_prompts.jsonl"


def iter_rows(
    spec: SourceSpec, storage_options: dict[str, Any] | None = None
) -> Iterator[tuple[int, Row]]:
    """Yield ``(row_number, row)`` for every row of the source, in a stable order.

    The source is located at call time, so a missing path or an unsupported format raises
    (FileNotFoundError, ValueError) here rather than on the first row.
    """
    options = storage_options or {}
    if spec.path.startswith(HF_PREFIX):
        return iter_hf(spec.path[len(HF_PREFIX) :], options)
    fs, path, files = _data_files(spec, options)
    if files is not None:
        return _iter_files(fs, files)
    if is_saved_dataset(fs, path):
        return iter_saved_dataset(spec.path, None, options)
    # CSV, Arrow, a dataset card with configs, …: let `datasets` work it out
    return iter_load_dataset(spec.path, None, options)


def count_rows(
    specs: list[SourceSpec], storage_options: dict[str, Any] | None = None
) -> int | None:
    """How many rows `mix_sources` yields without a limit, when each source's format can say
    without reading its rows (`SourceFormat.count`); None when one cannot."""
    total = 0
    for spec in specs:
        if spec.path.startswith(HF_PREFIX):
            return None
        fs, _, files = _data_files(spec, storage_options or {})
        if files is None:
            return None
        for path in files:
            fmt = _format_of(path)
            rows = fmt.count(fs, path) if fmt is not None else None
            if rows is None:
                return None
            total += rows
    return total


def _data_files(spec: SourceSpec, options: dict[str, Any]) -> tuple[Any, str, list[str] | None]:
    """The filesystem, the path in it and the data files of a file, a directory or a glob
    (None: a directory that `datasets` reads instead); raises as `iter_rows` says."""
    fs, path = fsspec.core.url_to_fs(spec.path, **options)
    if any(ch in path for ch in "*?["):
        files = sorted(p for p in fs.glob(path) if _is_data_file(p))
        if not files:
            raise FileNotFoundError(f"no {'/'.join(SOURCE_FORMATS)} files match {spec.path}")
        return fs, path, files
    if fs.isdir(path):
        if is_saved_dataset(fs, path):
            return fs, path, None
        return fs, path, sorted(p for p in fs.find(path) if _is_data_file(p)) or None
    if not fs.exists(path):
        raise FileNotFoundError(f"source not found: {spec.path}")
    if not _is_data_file(path):
        raise ValueError(_unsupported(spec.path))
    return fs, path, [path]


def _unsupported(path: str) -> str:
    return f"unsupported source format: {path} ({', '.join(SOURCE_FORMATS)})"


def _format_of(path: str) -> SourceFormat | None:
    """The registered format with the longest file name ending this file has (before any
    compression suffix)."""
    name = _strip_compression(Path(path).name.lower())
    matching = [
        (len(ext), fmt)
        for fmt in SOURCE_FORMATS.values()
        for ext in fmt.extensions
        if name.endswith(ext)
    ]
    return max(matching, key=lambda match: match[0])[1] if matching else None


def _is_data_file(path: str) -> bool:
    name = Path(path).name.lower()
    if name.startswith((".", "_")):  # hidden files, Spark's _SUCCESS and friends
        return False
    return _format_of(name) is not None


def _strip_compression(name: str) -> str:
    for ext in _COMPRESSION_EXTS:
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def _iter_files(fs: Any, files: Iterable[str]) -> Iterator[tuple[int, Row]]:
    # Row numbers run on across files, so (source, row) names one row of the whole directory.
    offset = 0
    for path in files:
        last = -1
        for last, row in _iter_file(fs, path):
            yield offset + last, row
        offset += last + 1


def _iter_file(fs: Any, path: str) -> Iterator[tuple[int, Row]]:
    fmt = _format_of(path)
    if fmt is None:
        raise ValueError(_unsupported(path))
    yield from fmt.read(fs, path)


def _open(fs: Any, path: str) -> Any:
    return fs.open(path, "rb", compression=infer_compression(path))


def _iter_lines(f: Any) -> Iterator[bytes]:
    # Our own splitter: fsspec's readline re-reads a whole block per line on remote files.
    pending: list[bytes] = []
    while chunk := f.read(_READ_CHUNK):
        parts = chunk.split(b"\n")
        if len(parts) == 1:
            pending.append(chunk)
            continue
        pending.append(parts[0])
        yield b"".join(pending)
        yield from parts[1:-1]
        pending = [parts[-1]] if parts[-1] else []
    if pending:
        yield b"".join(pending)


def _parse_object(raw: bytes) -> Row:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
    return value if isinstance(value, dict) else raw


def _iter_jsonl(fs: Any, path: str) -> Iterator[tuple[int, Row]]:
    with _open(fs, path) as f:
        for number, line in enumerate(_iter_lines(f)):
            if number == 0 and line.startswith(b"\xef\xbb\xbf"):  # UTF-8 BOM
                line = line[3:]
            if line.strip():
                yield number, _parse_object(line)


def _count_jsonl(fs: Any, path: str) -> int | None:
    """The rows `_iter_jsonl` yields, without parsing them; on this machine's disk only (a
    remote file would be downloaded twice)."""
    if "file" not in fs.protocol:
        return None
    with _open(fs, path) as f:
        lines = _iter_lines(f)
        first = next(lines, b"").removeprefix(b"\xef\xbb\xbf")
        return bool(first.strip()) + sum(1 for line in lines if line.strip())


def _iter_json(fs: Any, path: str) -> Iterator[tuple[int, Row]]:
    with _open(fs, path) as f:
        data = f.read()
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if not data.lstrip().startswith(b"["):  # JSON Lines under a .json name
        for number, line in enumerate(data.split(b"\n")):
            if line.strip():
                yield number, _parse_object(line)
        return
    try:
        items = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise ValueError(f"{path}: not a JSON array: {err}") from None
    for number, item in enumerate(items):
        yield number, item if isinstance(item, dict) else orjson.dumps(item)


def _iter_parquet(fs: Any, path: str) -> Iterator[tuple[int, Row]]:
    with _open(fs, path) as f:
        number = 0
        for batch in pq.ParquetFile(f).iter_batches(batch_size=_PARQUET_BATCH):
            for row in batch.to_pylist():
                yield number, row
                number += 1


def _count_parquet(fs: Any, path: str) -> int | None:
    with _open(fs, path) as f:
        return int(pq.ParquetFile(f).metadata.num_rows)  # the footer only


def _not_counted(fs: Any, path: str) -> int | None:
    return None


@dataclass(frozen=True)
class SourceFormat:
    """A file format prompts are read from: its readers' rows, as `iter_rows` yields them."""

    extensions: tuple[str, ...]  # lowercase file name endings, before a compression suffix
    read: Callable[[Any, str], Iterator[tuple[int, Row]]]  # (fsspec filesystem, path)
    # how many rows `read` will yield, when that is cheap to know before (publish's total);
    # None: not known until read
    count: Callable[[Any, str], int | None] = _not_counted


SOURCE_FORMATS: Registry[SourceFormat] = Registry(
    "source format",
    [
        ("jsonl", SourceFormat((".jsonl", ".ndjson"), _iter_jsonl, _count_jsonl)),
        ("json", SourceFormat((".json",), _iter_json)),
        ("parquet", SourceFormat((".parquet", ".pq"), _iter_parquet, _count_parquet)),
    ],
)


def row_error(raw: bytes) -> RecordError:
    """Why a row came out of `iter_rows` as bytes: `invalid_utf8`, `not_json` or `bad_shape`."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        kind = "invalid_utf8" if "utf-8" in str(err).lower() else "not_json"
        return RecordError(kind, str(err))
    return RecordError("bad_shape", f"expected a JSON object, got {type(value).__name__}")


def mix_sources(
    specs: list[SourceSpec],
    limit: int | None = None,
    *,
    seed: int = 0,
    storage_options: dict[str, Any] | None = None,
) -> Iterator[tuple[SourceSpec, int, Row]]:
    """Rows of several sources, at most `limit` in all (None: until every source is exhausted).

    Without weights the sources are read one after another. With weights (relative: 7 and 3
    mean 70% and 30%) they are interleaved by stride scheduling: each source takes its turn
    every 1/weight steps, so at any point the counts are within about one row per source of
    the exact proportions; the seed only sets each source's starting phase. An exhausted
    source drops out and the others keep their relative weights. Deterministic for given
    specs, seed and source contents.
    """
    # Checked here, not in the generator, so a bad call fails at once rather than on first use.
    weighted = [spec.weight is not None for spec in specs]
    if any(weighted) and not all(weighted):
        raise ValueError("give a weight to every source or to none")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    iterators = [iter_rows(spec, storage_options) for spec in specs]  # a missing source fails now
    order = _stride_order(specs, seed) if all(weighted) and specs else _sequential(specs)
    return _mix(specs, iterators, order, limit)


def _mix(
    specs: list[SourceSpec],
    iterators: list[Iterator[tuple[int, Row]]],
    order: _Schedule,
    limit: int | None,
) -> Iterator[tuple[SourceSpec, int, Row]]:
    if limit == 0:
        return
    with ExitStack() as stack:  # close every open file when the consumer stops early
        for it in iterators:
            close = getattr(it, "close", None)
            if close is not None:
                stack.callback(close)
        emitted = 0
        for index in order:
            try:
                number, row = next(iterators[index])
            except StopIteration:
                order.exhausted(index)
                continue
            yield specs[index], number, row
            emitted += 1
            if limit is not None and emitted >= limit:
                return


class _Schedule:
    """An endless iterator of source indexes; a source leaves it once marked `exhausted`."""

    def __init__(self, passes: dict[int, float], strides: dict[int, float]):
        self._passes = passes
        self._strides = strides
        self._last: int | None = None

    def __iter__(self) -> _Schedule:
        return self

    def __next__(self) -> int:
        if self._last is not None:
            self._passes[self._last] += self._strides[self._last]
        if not self._passes:
            raise StopIteration
        # Lowest pass first; ties go to the earlier source.
        self._last = min(self._passes, key=lambda i: (self._passes[i], i))
        return self._last

    def exhausted(self, index: int) -> None:
        self._passes.pop(index, None)
        if self._last == index:
            self._last = None


def _stride_order(specs: list[SourceSpec], seed: int) -> _Schedule:
    rng = random.Random(seed)
    strides = {i: 1.0 / float(spec.weight or 1.0) for i, spec in enumerate(specs)}
    passes = {i: rng.random() * stride for i, stride in strides.items()}
    return _Schedule(passes, strides)


def _sequential(specs: list[SourceSpec]) -> _Schedule:
    # Equal passes and zero strides: always the first source not yet exhausted.
    return _Schedule(dict.fromkeys(range(len(specs)), 0.0), dict.fromkeys(range(len(specs)), 0.0))
