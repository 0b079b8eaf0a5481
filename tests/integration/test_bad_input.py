"""Bad input becomes a dead letter with its stage and reason, and the stage carries on."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections import Counter
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from compose.process import free_port
from compose.stack import draftgen_argv
from streams.core.records import PromptRecord
from streams.core.settings import COMPLETIONS, PROMPTS, KafkaSettings
from tests.polling import wait_for

pytestmark = pytest.mark.integration

BAD_ROWS = {
    "not_json": b"{this is not json",
    "invalid_utf8": b'{"messages": [{"role": "user", "content": "caf\xe9"}]}',
    "bad_shape": b"[1, 2, 3]",
    "empty_messages": b'{"messages": []}',
    "unknown_role": b'{"messages": [{"role": "wizard", "content": "hi"}]}',
    "non_string_content": b'{"messages": [{"role": "user", "content": 42}]}',
    "record_too_large": orjson.dumps(
        {"messages": [{"role": "user", "content": "x" * (9 * 1024 * 1024)}]}
    ),
}


async def _send_raw(kafka: KafkaSettings, topic: str, values: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(**kafka.aiokafka_kwargs(), max_request_size=16 * 1024 * 1024)
    await producer.start()
    try:
        for key, value in values:
            await producer.send_and_wait(kafka.topic(topic), key=key, value=value)
    finally:
        await producer.stop()


def test_bad_rows_and_records_are_dead_lettered_at_every_stage(
    pipeline, write_prompts, tmp_path: Path
) -> None:
    good = write_prompts(20).read_bytes()
    source = tmp_path / "mixed.jsonl"
    source.write_bytes(good + b"\n".join(BAD_ROWS.values()) + b"\n")
    url, _ = pipeline.emulator()
    workers = [pipeline.generate(url), pipeline.tokenize()]

    summary = pipeline.publish(source)
    assert summary.published == 20
    assert summary.rejected == Counter(dict.fromkeys(BAD_ROWS, 1))

    # records that reach a stage's input topic without going through publish
    ends_with_assistant = PromptRecord(
        prompt_id="ends-with-assistant",
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    )
    asyncio.run(
        _send_raw(
            pipeline.kafka,
            PROMPTS,
            [
                (b"raw-1", b"not json at all"),
                (b"raw-2", b'{"v": 1, "prompt_id": "p", "messages": "\xff\xfe"}'),
                (b"raw-3", b'{"v": 1, "something": "else"}'),
                (b"ends-with-assistant", ends_with_assistant.encode()),
            ],
        )
    )
    asyncio.run(_send_raw(pipeline.kafka, COMPLETIONS, [(b"raw-4", b"\x00\x01 binary")]))

    expected = set(summary.prompt_ids) | {"raw-1", "raw-2", "raw-3", "ends-with-assistant", "raw-4"}
    pipeline.wait(expected, workers)
    pipeline.assert_exactly_once(expected)
    reasons = Counter((letter.stage, letter.kind) for letter in pipeline.dead_letters())
    assert reasons == Counter(
        {
            **{("publish", kind): 1 for kind in BAD_ROWS},
            ("generate", "not_json"): 1,
            ("generate", "invalid_utf8"): 1,
            ("generate", "bad_shape"): 1,
            ("generate", "ends_with_assistant"): 1,
            ("tokenize", "not_json"): 1,
        }
    )
    assert all(worker.alive() for worker in workers)


def test_chat_template_that_raises_dead_letters_those_samples(
    pipeline, write_prompts, tmp_path: Path
) -> None:
    template = (pipeline.tokenizer_dir / "tokenizer_config.json").read_bytes()
    original = orjson.loads(template)["chat_template"]
    raising = tmp_path / "raising.jinja"
    raising.write_text(
        "{%- if messages[0].role == 'system' %}{{ raise_exception('no system prompts') }}"
        "{%- endif %}" + original
    )
    url, _ = pipeline.emulator()
    workers = [
        pipeline.generate(url),
        pipeline.tokenize("--token-source", "rendered", "--chat-template", str(raising)),
    ]
    rows = [orjson.loads(line) for line in write_prompts(30).read_bytes().splitlines()]
    summary = pipeline.publish(write_prompts(30))
    pipeline.wait(set(summary.prompt_ids), workers)
    pipeline.assert_exactly_once(set(summary.prompt_ids))

    with_system = sum(1 for row in rows if row["messages"][0]["role"] == "system")
    letters = pipeline.dead_letters()
    assert with_system > 0
    assert [letter.kind for letter in letters] == ["template_error"] * with_system
    assert all("no system prompts" in letter.message for letter in letters)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        draftgen_argv(*args),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_workers_refuse_to_start_with_one_line(pipeline, tmp_path: Path) -> None:
    base = ["worker", "tokenize", "--bootstrap", pipeline.bootstrap, "--dataset", "d"]
    missing = run_cli(*base, "--tokenizer-dir", str(tmp_path / "nope"), "--out", str(tmp_path))
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0, missing.stderr
    assert "does not exist" in missing.stderr and "nope" in missing.stderr

    unreadable = tmp_path / "broken-tokenizer"
    unreadable.mkdir()
    (unreadable / "tokenizer_config.json").write_text("{not json")
    broken = run_cli(*base, "--tokenizer-dir", str(unreadable), "--out", str(tmp_path))
    assert broken.returncode == 2 and "cannot load a tokenizer" in broken.stderr
    assert "Traceback" not in broken.stderr

    unreachable = {**pipeline.env, "DRAFTGEN_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    no_bucket = run_cli(
        *base,
        "--tokenizer-dir",
        str(pipeline.tokenizer_dir),
        "--out",
        "s3://draftgen-test/x",
        env=unreachable,
    )
    assert no_bucket.returncode == 2
    assert "cannot write to s3://draftgen-test/x/d" in no_bucket.stderr
    assert no_bucket.stderr.strip().count("\n") == 0, no_bucket.stderr
    assert pipeline.s3.endpoint.secret_key not in no_bucket.stderr

    bad_flag = run_cli("publish", "--limit", "many", "--bootstrap", pipeline.bootstrap)
    assert bad_flag.returncode == 2 and bad_flag.stderr.count("\n") == 1


def test_dead_letters_are_listed_and_can_be_republished(pipeline, write_prompts) -> None:
    url, _ = pipeline.emulator("--fail-400-rate", "0.3")
    workers = [pipeline.generate(url), pipeline.tokenize()]
    summary = pipeline.publish(write_prompts(20))
    pipeline.wait(set(summary.prompt_ids), workers)
    letters = pipeline.dead_letters()
    assert letters and {letter.kind for letter in letters} == {"context_too_long"}

    listing = run_cli("dead-letters", *pipeline.common)
    assert listing.returncode == 0, listing.stderr
    assert f"{len(letters)} dead letters" in listing.stdout
    assert "generate" in listing.stdout and "context_too_long" in listing.stdout

    # the same prompts go back to `prompts`; the injected 400 is per prompt, so they fail again
    again = run_cli("dead-letters", *pipeline.common, "--stage", "generate", "--republish")
    assert again.returncode == 0, again.stderr
    assert f"re-published {len(letters)}" in again.stdout
    wait_for(
        lambda: len(pipeline.dead_letters()) >= 2 * len(letters),
        60,
        f"the {len(letters)} re-published prompts dead-lettered again",
        interval=0.5,
    )
    assert len(pipeline.dead_letters()) == 2 * len(letters)
