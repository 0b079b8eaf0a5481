"""Secrets come from the environment and never reach a log line or an error message."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

API_KEY = "sk-live-7f3a9c1e2b4d6f8a0c2e4a6b"
SASL_PASSWORD = "sasl-pw-0b1c2d3e4f5a6b7c"


def test_no_secret_in_any_log(pipeline, write_prompts) -> None:
    secrets = {
        "DRAFTGEN_API_KEY": API_KEY,
        # set but unused on a PLAINTEXT broker: it must still never be printed
        "DRAFTGEN_KAFKA_SASL_PASSWORD": SASL_PASSWORD,
    }
    # a failing server and a worker with a wrong S3 secret give error paths something to say
    url, _ = pipeline.emulator("--fail-500-rate", "0.3", "--fail-400-rate", "0.1")
    workers = [
        pipeline.generate(url, "--max-attempts", "3", env=secrets, log_level="DEBUG"),
        pipeline.tokenize(env=secrets),
    ]
    wrong = pipeline.tokenize(
        dataset="other",
        name="tokenize-wrong-secret",
        env={**secrets, "DRAFTGEN_S3_SECRET_KEY": "wrong-" + pipeline.s3.endpoint.secret_key},
    )
    summary = pipeline.publish(write_prompts(30))
    pipeline.wait(set(summary.prompt_ids), workers)
    wrong.stop()

    logs = {p.name: p.log_path.read_text(errors="replace") for p in pipeline.stack.processes}
    assert any(
        "retrying" in text or "refuse" in text or "error" in text.lower() for text in logs.values()
    )
    for name, text in logs.items():
        for secret in (API_KEY, SASL_PASSWORD, pipeline.s3.endpoint.secret_key):
            assert secret not in text, f"{name} logged a secret"
