"""`draftgen replay` never writes into a dataset version a tokenize worker built."""

from __future__ import annotations

import pytest

from streams.cli.replay import REPLAY_MANIFEST, check, refusal
from streams.core.errors import CliError
from streams.core.settings import KafkaSettings, StorageSettings, TokenizeSettings


def test_replay_refuses_an_existing_tokenize_version_and_resumes_its_own() -> None:
    assert refusal(None, "v2") is None
    assert refusal({"dataset": "v2", **REPLAY_MANIFEST}, "v2") is None
    message = refusal({"dataset": "v1"}, "v1")
    assert message is not None and "already exists" in message


def test_the_check_marks_the_manifest_or_refuses_with_one_line() -> None:
    settings = TokenizeSettings(
        tokenizer_dir="t",
        dataset="v1",
        storage=StorageSettings(out="o"),
        kafka=KafkaSettings(bootstrap="b:1"),
    )
    assert check(None, settings)["replay"] is True
    with pytest.raises(CliError, match="already exists"):
        check({"dataset": "v1"}, settings)
