"""`draftgen report`'s figures are the version's: a version built with known drops and errors of
every stage (publish rejects, a generate failure, the tokenize stage's policy drops and error),
beside a second version under the same topic prefix, and every count of its report checked
against the known numbers and against what `status`, the sealed manifest, the reader and
`dead-letters` say, unsealed and sealed."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from sinks.reader import DatasetReader
from streams.cli.main import main
from streams.core.records import CompletionRecord, PromptRecord
from streams.core.settings import COMPLETIONS, PROMPTS
from tests.integration.test_bad_input import _send_raw
from tests.integration.test_scale_out import produce

pytestmark = pytest.mark.integration

BAD_ROWS = [b"{this is not json", b'{"messages": []}']
UPSTREAM = {"publish/not_json": 1, "publish/empty_messages": 1, "generate/ends_with_assistant": 1}
SYNTHETIC = 10  # answers produced straight to `completions`: the even ones cut by length


def synthetic(index: int) -> CompletionRecord:
    return CompletionRecord(
        prompt_id=f"syn-{index:02d}",
        messages=[{"role": "user", "content": f"What is {index} squared?"}],
        source="synthetic",
        reasoning_content=f"{index} times {index}.",
        content=f"It is {index * index}.",
        finish_reason="length" if index % 2 == 0 else "stop",
    )


def cli(pipeline: Any, *args: str, timeout: float = 300) -> str:
    done = pipeline.draftgen(*args, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done.stdout


def report(pipeline: Any, tmp_path: Path, name: str, *extra: str) -> dict[str, Any]:
    output = tmp_path / name
    argv = ["report", "--out", pipeline.out, "--dataset", pipeline.dataset]
    assert main([*argv, "--to", str(output), *extra]) == 0
    figures: dict[str, Any] = orjson.loads((output / "report.json").read_bytes())
    figures["html"] = (output / "report.html").read_text()
    return figures


def test_every_figure_of_the_report_is_the_versions(
    pipeline: Any, write_prompts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in pipeline.env.items():
        monkeypatch.setenv(key, value)
    url, _ = pipeline.emulator()
    workers = [pipeline.generate(url), pipeline.tokenize(), pipeline.tokenize(dataset="other")]

    source = tmp_path / "mixed.jsonl"
    source.write_bytes(write_prompts(20).read_bytes() + b"\n".join(BAD_ROWS) + b"\n")
    summary = pipeline.publish(source)
    assert summary.published == 20 and sum(summary.rejected.values()) == len(BAD_ROWS)
    ends_with_assistant = PromptRecord(
        prompt_id="ends-with-assistant",
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    )
    asyncio.run(
        _send_raw(pipeline.kafka, PROMPTS, [(b"ends-with-assistant", ends_with_assistant.encode())])
    )
    produce(pipeline.kafka, [synthetic(i) for i in range(SYNTHETIC)])
    asyncio.run(_send_raw(pipeline.kafka, COMPLETIONS, [(b"raw-bad", b"\x00\x01 not json")]))

    synthetic_ids = {f"syn-{i:02d}" for i in range(SYNTHETIC)}
    expected = set(summary.prompt_ids) | synthetic_ids | {"ends-with-assistant", "raw-bad"}
    pipeline.wait(expected, workers)
    pipeline.wait(expected, workers, dataset="other")

    # what every view says of the version
    table = DatasetReader(pipeline.store()).table()
    letters = Counter(f"{x.stage}/{x.kind}" for x in pipeline.dead_letters())
    # the other version dropped the same prompts: the topic holds both versions' letters
    assert letters["tokenize/policy_length"] == 2 * (SYNTHETIC // 2)
    assert {k: n for k, n in letters.items() if not k.startswith("tokenize/")} == UPSTREAM
    broker = ["--bootstrap", pipeline.bootstrap, "--topic-prefix", pipeline.prefix]
    status = orjson.loads(cli(pipeline, "status", *broker, "--out", pipeline.out, "--json"))
    row = status["datasets"][pipeline.dataset]
    own_drops = {"policy_length": SYNTHETIC // 2, "not_json": 1}
    assert row["drops"] == own_drops
    assert status["dead_letters"]["by_stage"]["publish"] == {"not_json": 1, "empty_messages": 1}

    def check(figures: dict[str, Any], sealed: bool) -> None:
        assert figures["sealed"] is sealed
        assert figures["samples"] == table.num_rows == row["samples"] == 20 + SYNTHETIC // 2
        assert figures["tokens"] == sum(table["num_tokens"].to_pylist()) == row["tokens"]
        assert figures["loss_tokens"] == row["loss_tokens"]
        assert figures["shards"] == row["shards"]
        assert figures["policy_drops"]["by_kind"] == {"policy_length": SYNTHETIC // 2}
        assert figures["errors"]["tokenize"]["by_kind"] == {"tokenize/not_json": 1}
        assert figures["errors"]["upstream"]["by_kind"] == UPSTREAM
        assert figures["errors"]["total"] == 1 + sum(UPSTREAM.values())
        assert figures["outcomes"]["prompts"] == len(expected) - 1  # less the generate failure
        by_source = figures["by_source"]
        assert by_source["synthetic"]["samples"] == SYNTHETIC // 2
        assert (by_source["synthetic"]["drops"], by_source["synthetic"]["drop_rate"]) == (5, 0.5)
        assert sum(s["samples"] for s in by_source.values()) == table.num_rows
        assert figures["supervised_tokens"]["total"] == figures["loss_tokens"]
        assert figures["not_recorded"] == ["duplicates.excluded_by_seal"] * (not sealed)
        assert ">Errors 0<" not in figures["html"]

    check(report(pipeline, tmp_path, "unsealed", *broker), sealed=False)
    # without the broker: the version's own drops still, the earlier stages' not recorded
    alone = report(pipeline, tmp_path, "alone")
    assert alone["policy_drops"]["by_kind"] == {"policy_length": SYNTHETIC // 2}
    assert alone["errors"]["upstream"]["by_kind"] == "not recorded"

    cli(pipeline, "seal", "--out", pipeline.out, "--dataset", pipeline.dataset, *broker)
    manifest = pipeline.store().sealed()
    assert manifest is not None and manifest.drops == own_drops
    sealed = report(pipeline, tmp_path, "sealed", *broker)
    check(sealed, sealed=True)
    assert sealed["samples"] == manifest.samples and sealed["tokens"] == manifest.tokens
