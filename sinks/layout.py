"""Where a dataset version's files live. Shard keys hold the start offset only, so a shard
rewritten after a crash replaces the same object (the Kafka S3 sink's recipe)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SHARD_NAME = re.compile(r"part-(\d{4})-(\d{12})\.(arrow|json)$")


def shard_stem(partition: int, start_offset: int) -> str:
    if partition < 0 or start_offset < 0:
        raise ValueError("partition and offset must be non-negative")
    return f"part-{partition:04d}-{start_offset:012d}"


def parse_shard_name(name: str) -> tuple[int, int]:
    """(partition, start_offset) from a shard or marker file name."""
    match = _SHARD_NAME.search(name)
    if not match:
        raise ValueError(f"not a shard name: {name!r}")
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True)
class DatasetLayout:
    """Paths of one dataset version under an output root (without the protocol's quirks)."""

    root: str
    dataset: str

    @property
    def base(self) -> str:
        return f"{self.root.rstrip('/')}/{self.dataset}"

    @property
    def manifest(self) -> str:
        return f"{self.base}/dataset.json"

    @property
    def sealed(self) -> str:
        """The sealed manifest (sinks/manifest.py): present once the version is sealed."""
        return f"{self.base}/sealed.json"

    @property
    def data_dir(self) -> str:
        return f"{self.base}/data"

    @property
    def committed_dir(self) -> str:
        return f"{self.base}/_committed"

    def shard(self, partition: int, start_offset: int) -> str:
        return f"{self.data_dir}/{shard_stem(partition, start_offset)}.arrow"

    def marker(self, partition: int, start_offset: int) -> str:
        return f"{self.committed_dir}/{shard_stem(partition, start_offset)}.json"
