"""The sealed manifest: the one file that says exactly which shards and rows make a dataset version.

Written once by `draftgen seal` after the version has caught up with `completions`; readers that
find it use it instead of listing commit markers. A shard may hold rows that are not part of
the version (an earlier answer of a prompt that was regenerated later): their row indices are in
`exclude`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from sinks.marker import epoch_read, epoch_stored

MANIFEST_VERSION = 1


@dataclass(frozen=True)
class ShardEntry:
    path: str  # relative to the dataset version's directory, e.g. data/part-0003-000000001200.arrow
    partition: int
    start_offset: int
    end_offset: int
    rows: int  # the window's rows in the file
    sha256: str
    exclude: list[int] = field(default_factory=list)  # row indices not in the version
    # the window's rows in a shard shared by a flush's windows (ShardMarker.row_start), and the
    # writer's group epoch (sinks/marker.py, EPOCH_KEY; None in older manifests: the path
    # names it)
    row_start: int = 0
    epoch: int | None = None
    file_rows: int = 0  # rows in the file, all windows' (0 in older manifests: `rows`)

    @property
    def kept(self) -> int:
        return self.rows - len(self.exclude)


@dataclass(frozen=True)
class SealedManifest:
    dataset: str
    sealed_at: float
    shards: list[ShardEntry]
    samples: int  # rows kept, over all shards
    tokens: int
    # prompt ids that ended as a recorded drop, by reason kind (policy or error)
    drops: dict[str, int] = field(default_factory=dict)
    # each dropped prompt id and its reason kind
    dropped: dict[str, str] = field(default_factory=dict)
    # rows written, then replaced by a later answer of the same prompt (excluded)
    replaced: int = 0
    # end offset (exclusive) of each completions partition the version covers
    offsets: dict[str, int] = field(default_factory=dict)
    v: int = MANIFEST_VERSION

    def encode(self) -> bytes:
        value = asdict(self)
        value["shards"] = [epoch_stored(entry) for entry in value["shards"]]
        return orjson.dumps(value, option=orjson.OPT_INDENT_2)

    @classmethod
    def decode(cls, raw: bytes) -> SealedManifest:
        data: dict[str, Any] = orjson.loads(raw)
        if data.get("v") != MANIFEST_VERSION:
            raise ValueError(f"unknown sealed manifest version {data.get('v')!r}")
        shards = [ShardEntry(**epoch_read(entry)) for entry in data.pop("shards")]
        return cls(shards=shards, **data)
