"""Long outputs on real Kafka and S3: completions of 128K output tokens reach a shard,
compressed on the topic; a completion over the message size limit becomes a dead letter and
the partition moves on. Prints the tokenize worker's peak RSS (VmHWM), which stays within the
sink's memory budget (max_open_bytes)."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from sinks.reader import DatasetReader
from streams.core.records import CompletionRecord
from tests.ids import as_list

pytestmark = pytest.mark.integration

OUTPUT_TOKENS = 128 * 1024
# every answer is this long (the emulator's text re-encodes to ~1% fewer tokens than it drew)
EMULATOR = (
    "--tokens-per-s", "0",
    "--min-output-tokens", "134000",
    "--max-output-tokens", "134000",
    "--max-model-len", "4000000",
)  # fmt: skip
MAX_OPEN_BYTES = 256 * 1024 * 1024  # the tokenize worker's default budget


def _status(pid: int, field: str) -> int:
    """A /proc/PID/status memory figure (VmRSS, VmHWM) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")


def _settled_rss(pid: int, timeout: float = 90) -> int:
    """VmRSS once the started worker stops growing (imports done, group joined): its idle
    size, what the sink's budget comes on top of."""
    deadline, last, same = time.monotonic() + timeout, -1, 0
    while time.monotonic() < deadline and same < 6:
        time.sleep(0.5)
        rss = _status(pid, "VmRSS")
        same = same + 1 if abs(rss - last) < 2**20 else 0
        last = rss
    return last


def test_long_completions_reach_a_shard_and_an_oversized_one_is_a_dead_letter(
    pipeline, infra, tmp_path
) -> None:
    pipeline.partitions = 1  # one partition: the oversized completion is ahead of the others
    # ~2 MB of prompt is ~1.2M prompt token ids: its completion is over the 8 MiB default limit
    # (the prompt itself is not)
    huge = " ".join(["explain the trade-offs of a write-ahead log"] * 50_000)
    rows = [{"messages": [{"role": "user", "content": huge}]}] + [
        {"messages": [{"role": "user", "content": f"[{i}] think long about logs"}]}
        for i in range(2)
    ]
    source = tmp_path / "prompts.jsonl"
    source.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))

    url, _ = pipeline.emulator(*EMULATOR)
    generate = pipeline.generate(url, "--max-tokens", "140000")
    tokenize = pipeline.tokenize()
    baseline = _settled_rss(tokenize.pid)
    published = pipeline.publish(source).prompt_ids
    assert len(published) == 3
    oversized, long_ones = published[0], set(published[1:])
    pipeline.wait(set(published), [generate, tokenize], timeout=300)
    peak = _status(tokenize.pid, "VmHWM")

    [letter] = pipeline.dead_letters()
    assert (letter.stage, letter.kind, letter.prompt_id) == (
        "generate",
        "record_too_large",
        oversized,
    )
    assert "8388608-byte limit" in letter.message
    pipeline.assert_exactly_once(set(published))

    completions = pipeline.completions()
    assert set(completions) == long_ones
    table = DatasetReader(pipeline.store()).table().to_pylist()
    assert {row["prompt_id"] for row in table} == long_ones
    for row in table:
        completion: CompletionRecord = completions[row["prompt_id"]]
        output = as_list(completion.output_token_ids)
        assert len(output) >= OUTPUT_TOKENS
        assert row["token_source"] == "server"
        assert row["input_ids"] == as_list(completion.prompt_token_ids) + output
        assert row["num_loss_tokens"] == len(output)

    # compressed on the topic: the broker's log holds far less than the records' bytes
    records = sum(len(c.encode()) for c in completions.values())
    assert infra.kafka is not None
    log = infra.kafka.log_dirs / f"{pipeline.kafka.topic('completions')}-0"
    stored = sum(f.stat().st_size for f in log.glob("*.log"))
    print(
        f"\ncompletions: {records} bytes of records, {stored} bytes in the broker's log; "
        f"tokenize worker RSS: {baseline / 2**20:.0f} MiB after start, "
        f"peak {peak / 2**20:.0f} MiB (budget {MAX_OPEN_BYTES / 2**20:.0f} MiB)"
    )
    assert stored < records / 2
    assert peak - baseline < MAX_OPEN_BYTES
