"""The whole path on real Kafka and real S3: prompts → two generate workers against two
emulated servers → completions → tokenize worker → committed Arrow shards on SeaweedFS."""

from __future__ import annotations

import datasets
import pyarrow as pa
import pytest

from sinks.reader import DatasetReader
from streams.core.tokenizers import load_tokenizer
from tests.ids import as_list

pytestmark = pytest.mark.integration


def test_300_prompts_end_to_end_on_kafka_and_s3(pipeline, write_prompts) -> None:
    workers = []
    for index in range(2):
        url, _ = pipeline.emulator("--seed", str(index), name=f"emulator-{index}")
        workers.append(pipeline.generate(url, name=f"generate-{index}"))
    workers.append(pipeline.tokenize())

    summary = pipeline.publish(write_prompts(300))
    assert summary.published == 300
    expected = set(summary.prompt_ids)
    result = pipeline.wait(expected, workers)
    assert not result.dead_letters.prompt_ids, result.dead_letters.by_reason
    pipeline.assert_exactly_once(expected)

    store = pipeline.store()
    table = DatasetReader(store).table()
    assert table.num_rows == 300
    assert set(table["prompt_id"].to_pylist()) == expected

    completions = pipeline.completions()
    tokenizer = load_tokenizer(pipeline.tokenizer_dir).tokenizer
    for row in table.to_pylist():
        completion = completions[row["prompt_id"]]
        masked = [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
        assert row["token_source"] == "server"
        assert masked == as_list(completion.output_token_ids)
        prompt_ids = as_list(completion.prompt_token_ids)
        assert row["input_ids"][: len(prompt_ids)] == prompt_ids
        assert row["num_loss_tokens"] == len(masked)
        text = tokenizer.decode(masked)
        assert text.endswith("<|im_end|>")
        if not completion.tool_calls:
            # the generated turn exactly: reasoning, </think>, the answer, end of turn
            assert text == f"{completion.reasoning_content}</think>{completion.content}<|im_end|>"

    # readable by pyarrow straight from S3, and by datasets
    for path in store.committed_shard_paths():
        with store.fs.open(path, "rb") as handle:
            assert pa.ipc.open_stream(handle).read_all().num_rows > 0
    loaded = datasets.load_dataset(
        "arrow",
        data_files=store.committed_shard_urls(),
        storage_options=pipeline.s3.endpoint.storage_options(),
        split="train",
    )
    assert loaded.num_rows == 300
    assert set(loaded.column_names) >= {"prompt_id", "input_ids", "loss_mask", "token_source"}
