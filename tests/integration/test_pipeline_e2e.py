"""The whole path on real Kafka and real S3: prompts → two generate workers against two
emulated servers → completions → tokenize worker → committed Arrow shards on SeaweedFS."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from aiokafka import AIOKafkaConsumer

from compose.stack import LocalStack
from producers.publish import publish
from producers.sources import parse_source_spec
from sinks.shards import ShardStore
from streams.progress import dataset_figures
from streams.records import CompletionRecord
from streams.run import wait_until_done
from streams.settings import COMPLETIONS, KafkaSettings
from streams.tokenizer_loading import load_tokenizer

pytestmark = pytest.mark.integration


async def read_completions(kafka: KafkaSettings, expected: int) -> dict[str, CompletionRecord]:
    consumer = AIOKafkaConsumer(
        kafka.topic(COMPLETIONS),
        **kafka.aiokafka_kwargs(),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    found: dict[str, CompletionRecord] = {}
    try:
        while len(found) < expected:
            batch = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 30)
            for records in batch.values():
                for record in records:
                    completion = CompletionRecord.decode(record.value)
                    found[completion.prompt_id] = completion
    finally:
        await consumer.stop()
    return found


def start_pipeline(
    stack: LocalStack,
    tokenizer_dir: Path,
    bootstrap: str,
    prefix: str,
    out: str,
    dataset: str,
    env: dict[str, str],
    servers: int = 2,
    emulator_options: tuple[str, ...] = (),
) -> list[Any]:
    common = ["--bootstrap", bootstrap, "--topic-prefix", prefix, "--partitions", "8"]
    workers = []
    for index in range(servers):
        url = stack.start_emulator(
            tokenizer_dir,
            "--tokens-per-s",
            "4000",
            "--seed",
            str(index),
            *emulator_options,
            name=f"emulator-{index}",
        )
        workers.append(
            stack.start_worker(
                f"generate-{index}",
                ["worker", "generate", "--server", url, "--concurrency", "16", *common],
                env=env,
            )
        )
    workers.append(
        stack.start_worker(
            "tokenize",
            [
                "worker",
                "tokenize",
                "--tokenizer",
                str(tokenizer_dir),
                "--out",
                out,
                "--dataset",
                dataset,
                "--idle-flush",
                "1",
                "--shard-records",
                "50",
                *common,
            ],
            env=env,
        )
    )
    return workers


def test_300_prompts_end_to_end_on_kafka_and_s3(
    stack, bootstrap, s3, s3_env, topic_prefix, write_prompts, qwen_tokenizer_dir
) -> None:
    source = write_prompts(300)
    kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=topic_prefix, partitions=8)
    out = f"s3://draftgen-test/{topic_prefix}out"
    workers = start_pipeline(stack, qwen_tokenizer_dir, bootstrap, topic_prefix, out, "e2e", s3_env)

    summary = asyncio.run(publish(kafka, [parse_source_spec(str(source))], progress=False))
    assert summary.published == 300
    store = ShardStore(out, "e2e", s3.endpoint.storage_options())
    result = asyncio.run(
        wait_until_done(kafka, store, set(summary.prompt_ids), workers, 300, show_progress=False)
    )
    assert not result.dead_letters.prompt_ids, result.dead_letters.by_reason

    figures = dataset_figures(store)
    assert figures.prompt_ids == set(summary.prompt_ids)
    assert figures.samples == 300 and figures.duplicate_ids == 0

    table = store.read_table()
    assert table.num_rows == 300
    assert len(set(table["prompt_id"].to_pylist())) == 300

    completions = asyncio.run(read_completions(kafka, 300))
    tokenizer = load_tokenizer(qwen_tokenizer_dir).tokenizer
    for row in table.to_pylist():
        completion = completions[row["prompt_id"]]
        masked = [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
        assert row["token_source"] == "server"
        assert masked == completion.output_token_ids
        assert (
            row["input_ids"][: len(completion.prompt_token_ids or [])]
            == completion.prompt_token_ids
        )
        text = tokenizer.decode(masked)
        assert text.endswith("<|im_end|>")
        if not completion.tool_calls:
            # the generated turn exactly: reasoning, </think>, the answer, end of turn
            assert text == f"{completion.reasoning_content}</think>{completion.content}<|im_end|>"

    # readable by pyarrow straight from S3, and by datasets
    fs = store.fs
    for path in store.committed_shard_paths():
        with fs.open(path, "rb") as handle:
            assert pa.ipc.open_stream(handle).read_all().num_rows > 0
    import datasets

    loaded = datasets.load_dataset(
        "arrow",
        data_files=store.committed_shard_urls(),
        storage_options=s3.endpoint.storage_options(),
        split="train",
    )
    assert loaded.num_rows == 300
    assert set(loaded.column_names) >= {"prompt_id", "input_ids", "loss_mask", "token_source"}
