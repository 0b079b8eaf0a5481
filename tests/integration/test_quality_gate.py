"""The quality gate end to end: an emulated server told to write loops and leaked reasoning at
given rates; the tokenize stage drops exactly those answers with their rule, keeps every other
one unflagged, and `report` shows each rule per source with examples."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest

from sinks.reader import DatasetReader
from streams.cli.main import main
from streams.core.families import FAMILIES

PROMPTS = 80
LONG = ("--min-output-tokens", "400", "--max-output-tokens", "600")  # loops long enough to judge


def loops(content: str) -> bool:
    """The ground truth of a loop, read from the text: one paragraph three times or more."""
    paragraphs = Counter(p for p in content.split("\n\n") if p.strip())
    return bool(paragraphs) and max(paragraphs.values()) >= 3


def test_the_gate_drops_injected_loops_and_leaks_and_nothing_else(
    pipeline, write_prompts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = pipeline.emulator(*LONG, "--loop-rate", "0.15", "--think-leak-rate", "0.15")
    workers = [pipeline.generate(url), pipeline.tokenize()]
    summary = pipeline.publish(write_prompts(PROMPTS))
    expected = set(summary.prompt_ids)
    pipeline.wait(expected, workers)
    pipeline.assert_exactly_once(expected)

    close = FAMILIES["qwen3"].think_close
    completions = pipeline.completions()
    looped = {pid for pid, c in completions.items() if loops(c.content or "")}
    leaked = {pid for pid, c in completions.items() if close in (c.content or "")}
    assert looped and leaked and not looped & leaked  # the server wrote both, apart
    dropped: dict[str, set[str]] = {}
    for letter in pipeline.dead_letters():
        dropped.setdefault(letter.kind, set()).add(str(letter.prompt_id))
    assert dropped == {"policy_repetition": looped, "policy_think_markers": leaked}
    table = DatasetReader(pipeline.store()).table(["prompt_id", "flags"])
    assert set(table["prompt_id"].to_pylist()) == expected - looped - leaked
    assert all(flags == [] for flags in table["flags"].to_pylist())

    for name, value in pipeline.env.items():  # the S3 of the shards, for the report
        monkeypatch.setenv(name, value)
    report_dir = tmp_path / "report"
    argv = ["report", "--out", pipeline.out, "--dataset", pipeline.dataset, "--to", str(report_dir)]
    assert main(argv) == 0
    gate = orjson.loads((report_dir / "report.json").read_bytes())["quality_gate"]
    assert {key: section["total"] for key, section in gate.items()} == {
        "drop:repetition": len(looped),
        "drop:think_markers": len(leaked),
    }
    (source,) = gate["drop:repetition"]["by_source"]
    assert source == "prompts.jsonl"
    examples = gate["drop:think_markers"]["examples"]
    assert examples and all(e.split(": ", 1)[0] in leaked and close in e for e in examples)
    assert "Quality gate" in (report_dir / "report.html").read_text()
