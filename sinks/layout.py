"""Where a dataset version's files live. A shard's key is its partition, start offset and the
writer's group epoch (sinks/marker.py; `g` in the name): a window rewritten after a crash by
the same epoch replaces the same object (the Kafka S3 sink's recipe); a new owner's rewrite
sits beside a zombie's, and the newer epoch wins (sinks/resolve.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# a shard shared by the windows of one flush carries a token after the first window's key
_SHARD_NAME = re.compile(r"part-(\d{4})-(\d{12})-g(\d{8})(?:-[0-9a-f]+)?\.(arrow|json)$")


def shard_stem(partition: int, start_offset: int, epoch: int = 0) -> str:
    if partition < 0 or start_offset < 0 or epoch < 0:
        raise ValueError("partition, offset and epoch must be non-negative")
    return f"part-{partition:04d}-{start_offset:012d}-g{epoch:08d}"


def parse_shard_name(name: str) -> tuple[int, int, int]:
    """(partition, start_offset, epoch) from a shard or marker file name."""
    match = _SHARD_NAME.search(name)
    if not match:
        raise ValueError(f"not a shard name: {name!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


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
    def fence(self) -> str:
        """Written by `draftgen seal` before it reads the offsets to seal at: from then on no
        worker commits a window of the version (sinks/sink.py)."""
        return f"{self.base}/_sealing.json"

    @property
    def data_dir(self) -> str:
        return f"{self.base}/data"

    @property
    def committed_dir(self) -> str:
        return f"{self.base}/_committed"

    def shard(self, partition: int, start_offset: int, epoch: int = 0) -> str:
        return f"{self.data_dir}/{shard_stem(partition, start_offset, epoch)}.arrow"

    def shared_shard(self, partition: int, start_offset: int, epoch: int, token: str) -> str:
        """A shard holding several windows (one flush's), named after its first window and a
        token of its own: a rewrite of that window after a crash must not replace the file
        that other windows' markers point at."""
        stem = shard_stem(partition, start_offset, epoch)
        return f"{self.data_dir}/{stem}-{token}.arrow"

    def marker(self, partition: int, start_offset: int, epoch: int = 0) -> str:
        return f"{self.committed_dir}/{shard_stem(partition, start_offset, epoch)}.json"
