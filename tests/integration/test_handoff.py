"""Hand-off to drafter training on real Kafka and S3: the reader (following the version while it
is generated, then whole, by rank and worker, as `datasets`), the three exports read back with
their consumers' libraries, and the data report; on the end-to-end pipeline's output, and on a
version built from the emulated server with the real Qwen3.6 vocabulary."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path
from typing import Any

import datasets
import orjson
import pyarrow.parquet as pq
import pytest

from sinks.reader import DatasetReader
from streams.cli.main import main
from streams.core.tokenizers import load_tokenizer
from streams.tools.report import sample_lengths
from tests.polling import wait_for

pytestmark = pytest.mark.integration


def run_pipeline(pipeline: Any, source: Path, emulators: int = 2) -> tuple[set[str], list[str]]:
    """Generate and tokenize `source`; meanwhile a follow stream reads the version as it grows.
    Returns the prompt ids and what the stream read."""
    workers = []
    for index in range(emulators):
        url, _ = pipeline.emulator("--seed", str(index), name=f"emulator-{index}")
        workers.append(pipeline.generate(url, name=f"generate-{index}"))
    workers.append(pipeline.tokenize())
    reader = DatasetReader(pipeline.store(), pipeline.s3.endpoint.storage_options())
    streamed: list[str] = []
    stop = threading.Event()
    stream = reader.stream(0, 1, follow=True, poll_s=0.5, stop=stop.is_set, columns=["prompt_id"])

    def follow() -> None:
        for sample in stream:
            streamed.append(sample["prompt_id"])

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()  # before anything is published: training starts with the run
    try:
        summary = pipeline.publish(source)
        expected = set(summary.prompt_ids)
        result = pipeline.wait(expected, workers)
        assert not result.dead_letters.prompt_ids, result.dead_letters.by_reason
        pipeline.assert_exactly_once(expected)
        wait_for(lambda: len(streamed) >= len(expected), 60, lambda: f"{len(streamed)} streamed")
    finally:
        stop.set()
        follower.join(30)
    return expected, streamed


def adjacent_supervised(mask: list[int]) -> bool:
    """SpecForge's DFlash filter (two adjacent supervised tokens)."""
    return any(a and b for a, b in itertools.pairwise(mask))


def check_reader(pipeline: Any, expected: set[str], tmp_path: Path) -> Any:
    options = pipeline.s3.endpoint.storage_options()
    reader = DatasetReader(pipeline.store(), options)
    table = reader.table()
    assert sorted(table["prompt_id"].to_pylist()) == sorted(expected)
    by_slot = [
        [s["prompt_id"] for s in reader.stream(rank, 2, worker=worker, num_workers=2)]
        for rank in range(2)
        for worker in range(2)
    ]
    assert sorted(itertools.chain(*by_slot)) == sorted(expected)
    loaded = reader.hf_dataset(cache_dir=str(tmp_path / "hf-cache"))
    assert loaded["prompt_id"] == table["prompt_id"].to_pylist()
    assert loaded[0]["input_ids"] == table["input_ids"][0].as_py()
    return table


def check_exports(pipeline: Any, table: Any, tmp_path: Path, monkeypatch: Any) -> list[dict]:
    for name, value in pipeline.env.items():
        monkeypatch.setenv(name, value)
    where = ["--out", pipeline.out, "--dataset", pipeline.dataset]
    rows = {r["prompt_id"]: r for r in table.to_pylist()}
    limit = sorted(r["num_tokens"] for r in rows.values())[len(rows) // 2]  # cuts half of them

    jsonl = tmp_path / "train.jsonl"
    assert main(["export", *where, "--format", "specforge", "--to", str(jsonl),
                 "--max-seq-len", str(limit)]) == 0  # fmt: skip
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    # SpecForge reads these three and ignores the rest (provenance, JSON text)
    assert set(lines[0]) == {"prompt_id", "input_ids", "loss_mask", "provenance"}
    for line in lines:
        row = rows[line["prompt_id"]]
        assert line["input_ids"] == row["input_ids"][:limit]
        assert line["loss_mask"] == row["loss_mask"][:limit]
        assert adjacent_supervised(line["loss_mask"])
    assert {line["prompt_id"] for line in lines} == {
        pid for pid, row in rows.items() if adjacent_supervised(row["loss_mask"][:limit])
    }

    hf = tmp_path / "hf"
    assert main(["export", *where, "--format", "hf", "--to", str(hf)]) == 0
    saved = datasets.load_from_disk(str(hf))
    assert saved.num_rows == len(rows)
    assert saved["prompt_id"] == table["prompt_id"].to_pylist()
    assert saved[0]["input_ids"] == table["input_ids"][0].as_py()

    parquet = tmp_path / "rows.parquet"
    assert main(["export", *where, "--format", "parquet", "--to", str(parquet),
                 "--finish-reason", "stop"]) == 0  # fmt: skip
    read = pq.read_table(parquet)
    assert sorted(read["prompt_id"].to_pylist()) == sorted(
        pid for pid, row in rows.items() if row["finish_reason"] == "stop"
    )
    return lines


def check_report(pipeline: Any, table: Any, tmp_path: Path) -> dict[str, Any]:
    output = tmp_path / "report"
    broker = ["--bootstrap", pipeline.bootstrap, "--topic-prefix", pipeline.prefix]
    assert main(["report", "--out", pipeline.out, "--dataset", pipeline.dataset,
                 "--to", str(output), *broker]) == 0  # fmt: skip
    report = orjson.loads((output / "report.json").read_bytes())
    assert report["samples"] == table.num_rows
    assert report["tokens"] == sum(table["num_tokens"].to_pylist())
    assert sum(s["samples"] for s in report["by_source"].values()) == table.num_rows
    split = report["reasoning_split"]
    assert split["computed"], split["note"]
    tokenizer = load_tokenizer(pipeline.tokenizer_dir).tokenizer
    think = tokenizer.convert_tokens_to_ids("</think>")
    assert split["think_close_id"] == think
    # every supervised turn here closes its thinking: the split covers every sample
    lengths = sample_lengths(table, think)
    assert split["samples_split"] == table.num_rows
    assert report["lengths"]["reasoning"]["mean"] == round(float(lengths["reasoning"].mean()), 2)
    # the broker was given: drops and errors are read from dead-letters, not "not recorded"
    assert report["policy_drops"]["by_kind"] == {}
    assert "policy_drops" not in report["not_recorded"]
    assert isinstance(report["duplicates"]["removed_by_tokenize"], int)  # its heartbeat is live
    assert report["drift"]["compared"] == table.num_rows
    page = (output / "report.html").read_text()
    # sources, lengths, finish reasons; and drops and errors when there are any
    drawn = bool(report["policy_drops"]["by_kind"] or report["errors"]["by_kind"])
    assert page.count("data:image/png;base64,") == 3 + drawn
    return report


def test_handoff_on_the_end_to_end_output(
    pipeline: Any, write_prompts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected, streamed = run_pipeline(pipeline, write_prompts(150))
    assert sorted(streamed) == sorted(expected)  # followed while generated: each once
    table = check_reader(pipeline, expected, tmp_path)
    check_exports(pipeline, table, tmp_path, monkeypatch)
    check_report(pipeline, table, tmp_path)


def test_handoff_with_the_real_qwen36_vocabulary(
    pipeline: Any,
    write_prompts: Any,
    qwen36_real_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline.tokenizer_dir = qwen36_real_dir
    expected, streamed = run_pipeline(pipeline, write_prompts(40), emulators=1)
    assert sorted(streamed) == sorted(expected)
    table = check_reader(pipeline, expected, tmp_path)
    lines = check_exports(pipeline, table, tmp_path, monkeypatch)
    report = check_report(pipeline, table, tmp_path)
    tokenizer = load_tokenizer(qwen36_real_dir).tokenizer
    assert tokenizer.vocab_size > 200_000
    assert report["reasoning_split"]["think_close_id"] == 248069  # Qwen3.5/3.6's </think>
    lengths = dict(
        zip(table["prompt_id"].to_pylist(), table["num_tokens"].to_pylist(), strict=True)
    )
    for line in lines:  # the exported turn is the target's, in its own vocabulary
        if len(line["input_ids"]) < lengths[line["prompt_id"]]:
            continue  # cut by --max-seq-len
        kept = [t for t, m in zip(line["input_ids"], line["loss_mask"], strict=True) if m]
        text = tokenizer.decode(kept)
        assert "</think>" in text and text.endswith("<|im_end|>"), text
