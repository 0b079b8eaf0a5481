"""`draftgen seal` waits for the version to exist (a replay just started) within its timeout."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sinks.shards import ShardStore
from streams.core.errors import CliError
from streams.core.settings import KafkaSettings
from streams.tools import seal
from streams.tools.seal import wait_for_version


def test_seal_waits_for_the_versions_dataset_json(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v2")
    looked = 0
    manifest = store.manifest

    def appearing() -> dict[str, Any] | None:
        nonlocal looked
        looked += 1
        if looked == 3:  # the replay's worker writes it while seal waits
            store.write_manifest({"dataset": "v2", "consumer_group": "g"})
        return manifest()

    store.manifest = appearing  # type: ignore[method-assign]
    info = asyncio.run(wait_for_version(store, timeout_s=30, poll_s=0.01))
    assert info["consumer_group"] == "g" and looked == 3


def test_seal_gives_up_on_a_version_that_never_appears_within_its_timeout(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v2")
    with pytest.raises(CliError, match=r"no dataset version .* after 0s"):
        asyncio.run(wait_for_version(store, timeout_s=0.05, poll_s=0.01))


def test_offsets_that_never_settle_are_refused_not_sealed(monkeypatch: pytest.MonkeyPatch) -> None:
    moving = iter(range(1_000_000))

    async def group_offsets(*args: Any) -> tuple[dict[int, int], Any]:
        return {0: next(moving)}, None

    monkeypatch.setattr(seal, "group_offsets", group_offsets)
    kafka = KafkaSettings(bootstrap="127.0.0.1:1")
    with pytest.raises(CliError, match="still commits after the fence"):
        asyncio.run(seal.settled_offsets(kafka, "g", timeout_s=0.05, settle_s=0.01))

    async def still(*args: Any) -> tuple[dict[int, int], Any]:
        return {0: 7}, None

    monkeypatch.setattr(seal, "group_offsets", still)
    assert asyncio.run(seal.settled_offsets(kafka, "g", timeout_s=0.05, settle_s=0.01)) == {0: 7}
