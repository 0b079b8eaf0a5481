"""`draftgen replay` never writes into a dataset version a tokenize worker built."""

from __future__ import annotations

from streams.cli.replay import refusal, replay_manifest


def test_replay_refuses_an_existing_tokenize_version_and_resumes_its_own() -> None:
    assert refusal(None, "v2") is None
    assert refusal(replay_manifest({"dataset": "v2"}), "v2") is None
    message = refusal({"dataset": "v1"}, "v1")
    assert message is not None and "already exists" in message
