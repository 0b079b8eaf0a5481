"""Sources the `datasets` library reads for `iter_rows` (producers/sources.py): `hf:` names
(Hub datasets streamed), `save_to_disk` directories, directories of CSV, Arrow, … files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec

# a `datasets` row is always a JSON object (`Row` of producers/sources.py, never its bytes)
Rows = Iterator[tuple[int, dict[str, Any]]]


def _split_hf_name(rest: str) -> tuple[str, str | None]:
    # `org/name:split`; a tail containing "/" belongs to a URL (`hf:s3://bucket/dir`).
    name, sep, tail = rest.rpartition(":")
    if sep and name and tail and "/" not in tail:
        return name, tail
    return rest, None


def iter_hf(rest: str, options: dict[str, Any]) -> Rows:
    name, split = _split_hf_name(rest)
    if not name:
        raise ValueError("hf: source without a dataset name")
    if "://" in name or Path(name).is_dir():  # a dataset on disk rather than on the Hub
        fs, path = fsspec.core.url_to_fs(name, **options)
        if not fs.isdir(path):
            raise FileNotFoundError(f"source not found: {name}")
        if is_saved_dataset(fs, path):
            return iter_saved_dataset(name, split, options)
    return iter_load_dataset(name, split, options)


def is_saved_dataset(fs: Any, path: str) -> bool:
    names = {Path(p).name for p in fs.ls(path, detail=False)}
    return bool(names & {"state.json", "dataset_dict.json"})  # written by save_to_disk


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise ImportError("reading this source needs the `datasets` package") from None
    return datasets


def iter_saved_dataset(url: str, split: str | None, options: dict[str, Any]) -> Rows:
    loaded = _datasets().load_from_disk(url, storage_options=options or None)
    yield from enumerate(_pick_split(loaded, split, url))


def iter_load_dataset(name: str, split: str | None, options: dict[str, Any]) -> Rows:
    # Streaming: bounded memory and no cache copy of the whole dataset. Storage options are
    # for URLs (s3://…); the Hub uses its own credentials.
    remote = "://" in name and options
    loaded = _datasets().load_dataset(
        name, split=split or "train", streaming=True, storage_options=options if remote else None
    )
    yield from enumerate(loaded)


def _pick_split(loaded: Any, split: str | None, url: str) -> Any:
    if not hasattr(loaded, "keys"):  # a single Dataset
        return loaded
    splits = list(loaded.keys())
    if split is None:
        split = "train" if "train" in splits or len(splits) != 1 else splits[0]
    if split not in splits:
        raise ValueError(f"{url}: no split {split!r} (have {', '.join(splits)})")
    return loaded[split]
