"""Replay throughput with 1, 2 and 4 replay workers on one dataset version, side by side in one
run, and the projected time to rebuild the last Kimi run (1.87B tokens, 902,087 samples) on
this machine and on a 16-core one (issue 12, target 2).

    flock /tmp/draftgen-heavy.lock .venv/bin/python tests/benchmarks/bench_replay.py \\
        [--completions N] [--workers 1,2,4] [--repeats 3] [--quick]

Starts its own Kafka broker and writes shards to a local directory (the S3 upload is not what
is measured). The completions are those of `bench_tokenize.py` (real text, the real Qwen3.6
vocabulary, the server's ids), produced straight onto the topic (nothing is generated). Each
configuration builds its own dataset version from the same completions as `draftgen replay`
does by default (server ids, drift measured), in rounds (every configuration once per round,
`--repeats` rounds); medians with the spread. A run ends when `seal` finds the version caught
up. "steady" leaves out start-up (imports, joining the group): it is measured from the first
committed window to the end, so it also leaves out the work done before that window commits
(more of it with more workers); the rate over the wall is the one to compare workers by.
CPU is the workers' user+system time over the run (from /proc), peak RSS each worker's VmHWM.

Then the same worker counts warm: each on topics of its own, started, joined (group Stable)
and with its encoder ready (the twin's log line) before the completions are produced; timed
from the first send to the version caught up, CPU over that time. Producing shares the cores.

The 16-core projection divides the tokens by the workers' CPU time per token spread over 16
cores: it assumes a worker per two cores (a worker's encoder uses two), the broker and S3 on
other machines (as in a deployment; here they share the two cores), and partitions ≥ workers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaProducer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from compose.process import ManagedProcess
from compose.stack import LocalStack
from compose.tiny_tokenizers import build_qwen36_tokenizer
from sinks.shards import ShardStore
from streams.core.settings import COMPLETIONS, KafkaSettings
from streams.core.topics import ensure_topics
from streams.ops.seal import seal
from streams.tokenize.encoder import TWIN_READY
from tests.benchmarks.bench_tokenize import Measure, make_data, measure, write_data
from tests.benchmarks.proc import cpu_s, peak_rss_mib
from tests.integration.probes import stable_members
from tests.polling import wait_for

PARTITIONS = 16
KIMI_RUN_TOKENS = 1_870_000_000
KIMI_RUN_SAMPLES = 902_087
CORES_16 = 16


@dataclass
class Result:
    workers: int
    seconds: float
    steady_s: float
    samples: int
    tokens: int
    cpu_s: float
    peak_rss_mb: float
    # warm runs: how long producing the completions took (the workers consumed meanwhile)
    producing_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def steady_tokens_per_s(self) -> float:
        return self.tokens / self.steady_s

    @property
    def cpu_us_per_token(self) -> float:
        return self.cpu_s * 1e6 / self.tokens


async def _produce(kafka: KafkaSettings, records: list[bytes]) -> None:
    await ensure_topics(kafka)
    producer = AIOKafkaProducer(**kafka.aiokafka_kwargs(), linger_ms=20)
    await producer.start()
    try:
        sends = [await producer.send(kafka.topic(COMPLETIONS), raw) for raw in records]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


def _replay_argv(kafka: KafkaSettings, tokenizer: Path, out: Path, dataset: str) -> list[str]:
    argv = ["replay", "--tokenizer", str(tokenizer), "--out", str(out), "--dataset", dataset]
    argv += ["--bootstrap", kafka.bootstrap, "--topic-prefix", kafka.topic_prefix]
    argv += ["--partitions", str(PARTITIONS), "--idle-flush", "2", "--heartbeat-interval", "0"]
    return argv


def run_one(
    stack: LocalStack, kafka: KafkaSettings, tokenizer: Path, out: Path, workers: int, run: str
) -> Result:
    dataset = f"bench-{workers}-{run}"
    store = ShardStore(str(out), dataset)
    argv = _replay_argv(kafka, tokenizer, out, dataset)
    started = time.monotonic()
    procs: list[ManagedProcess] = [
        stack.start_worker(f"{dataset}-{i}", argv) for i in range(workers)
    ]
    try:
        wait_for(lambda: store.markers(), 300, "the first committed window")
        first = time.monotonic()
        manifest = asyncio.run(seal(kafka, store, timeout_s=3600, on_lag=lambda lag: None))
        ended = time.monotonic()
        pids = [p.pid for p in procs if p.pid is not None]
        cpu = sum(cpu_s(pid) for pid in pids)
        rss = max(peak_rss_mib(pid) for pid in pids)
    finally:
        for proc in procs:
            proc.stop()
    return Result(
        workers, ended - started, ended - first, manifest.samples, manifest.tokens, cpu, rss
    )


def run_warm(
    stack: LocalStack,
    kafka: KafkaSettings,
    tokenizer: Path,
    out: Path,
    workers: int,
    run: str,
    records: list[bytes],
) -> Result:
    """Workers started on empty topics of their own, joined and with their encoder ready; then
    the completions are produced. Timed from the first send to the version caught up; CPU is
    the workers' over that time."""
    kafka = kafka.model_copy(update={"topic_prefix": f"{kafka.topic_prefix}w{workers}r{run}-"})
    asyncio.run(ensure_topics(kafka))
    dataset = f"warm-{workers}-{run}"
    store = ShardStore(str(out), dataset)
    argv = ["--log-level", "INFO", *_replay_argv(kafka, tokenizer, out, dataset)]  # ready line
    procs = [stack.start_worker(f"{dataset}-{i}", argv) for i in range(workers)]
    try:
        group = f"draftgen-tokenize-{dataset}"
        wait_for(lambda: _ready(procs, kafka, group), 300, "the workers joined, encoders ready")
        pids = [p.pid for p in procs if p.pid is not None]
        cpu0 = sum(cpu_s(pid) for pid in pids)
        started = time.monotonic()
        asyncio.run(_produce(kafka, records))
        produced = time.monotonic()
        manifest = asyncio.run(seal(kafka, store, timeout_s=3600, on_lag=lambda lag: None))
        ended = time.monotonic()
        cpu = sum(cpu_s(pid) for pid in pids) - cpu0
        rss = max(peak_rss_mib(pid) for pid in pids)
    finally:
        for proc in procs:
            proc.stop()
    seconds = ended - started
    return Result(
        workers, seconds, seconds, manifest.samples, manifest.tokens, cpu, rss, produced - started
    )


def _ready(procs: list[ManagedProcess], kafka: KafkaSettings, group: str) -> bool:
    for proc in procs:
        if not proc.alive():
            raise RuntimeError(f"a worker exited:\n{proc.tail()}")
    if not all(TWIN_READY in p.log_path.read_text(errors="replace") for p in procs):
        return False
    return asyncio.run(stable_members(kafka, group)) >= len(procs)


def main(argv: list[str] | None = None) -> dict[int, list[Result]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completions", type=int, default=6000)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes")
    args = parser.parse_args(argv)
    if args.quick:
        args.completions, args.workers, args.repeats = 60, "1,2", 1
    counts = [int(n) for n in args.workers.split(",")]
    results: dict[int, list[Result]] = {n: [] for n in counts}
    warm: dict[int, list[Result]] = {n: [] for n in counts}
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        root = Path(tmp)
        with LocalStack(root / "stack") as stack:
            kafka = KafkaSettings(
                bootstrap=stack.start_kafka(),
                topic_prefix=f"b{uuid.uuid4().hex[:6]}-",
                partitions=PARTITIONS,
            )
            tokenizer = build_qwen36_tokenizer(root / "qwen36-real", vocab="qwen")
            records, texts = make_data(tokenizer, args.completions)
            data = write_data(root / "data.json", tokenizer, records, texts)
            asyncio.run(_produce(kafka, records))
            baseline: list[Measure] = []
            for run in range(args.repeats):
                # alternating: encode_batch_fast on the same texts, then every worker count
                baseline.append(measure("encode_batch_fast", data, len(records)))
                for n in counts:
                    results[n].append(run_one(stack, kafka, tokenizer, root / "out", n, str(run)))
                for n in counts:
                    warm[n].append(
                        run_warm(stack, kafka, tokenizer, root / "out", n, str(run), records)
                    )
    report(results, baseline, args)
    report_warm(warm, args)
    return results


def report_warm(warm: dict[int, list[Result]], args: argparse.Namespace) -> None:
    median = statistics.median
    base = median([r.tokens_per_s for r in warm[min(warm)]])
    print(
        f"warm workers (joined, encoders ready, then the {args.completions} completions "
        "produced): from the first send to the version caught up"
    )
    print(
        "workers  s (min–max)          tokens/s   ratio  producing s  CPU µs/token  "
        "1.87B here  1.87B on 16 cores"
    )
    for n, runs in warm.items():
        seconds = [r.seconds for r in runs]
        rate = median([r.tokens_per_s for r in runs])
        cpu_per_token = median([r.cpu_us_per_token for r in runs]) / 1e6
        spread = f"{median(seconds):.1f} ({min(seconds):.1f}–{max(seconds):.1f})"
        print(
            f"{n:>7}  {spread:<18} {rate:>10,.0f}  {rate / base:5.2f}  "
            f"{median([r.producing_s for r in runs]):11.1f}  {cpu_per_token * 1e6:12.2f}  "
            f"{KIMI_RUN_TOKENS / rate / 3600:8.2f} h  "
            f"{KIMI_RUN_TOKENS * cpu_per_token / CORES_16 / 3600:15.2f} h"
        )


def report(
    results: dict[int, list[Result]], baseline: list[Measure], args: argparse.Namespace
) -> None:
    median = statistics.median
    base = results[min(results)]
    base_steady = median([r.steady_tokens_per_s for r in base])
    sample = base[0]
    encode = [m.tokens_per_s for m in baseline]
    print(
        f"encode_batch_fast on the same texts: {median(encode):,.0f} tokens/s "
        f"({min(encode):,.0f}–{max(encode):,.0f}); one worker's steady rate is "
        f"{base_steady / median(encode):.2f}× it"
    )
    print(
        f"replay of {args.completions} completions ({sample.tokens} tokens, "
        f"{sample.tokens / max(sample.samples, 1):.0f} per sample; the Kimi run averaged "
        f"{KIMI_RUN_TOKENS / KIMI_RUN_SAMPLES:.0f}), {PARTITIONS} partitions, {os.cpu_count()} "
        f"cores shared with the broker; medians of {args.repeats} (min–max)"
    )
    base_wall = median([r.tokens_per_s for r in base])
    print(
        "workers  wall s  tokens/s (wall)  ratio  steady tokens/s (min–max)       "
        "CPU µs/token  peak RSS MB  1.87B here (steady–wall)  1.87B on 16 cores"
    )
    for n, runs in results.items():
        wall = median([r.tokens_per_s for r in runs])
        steady = [r.steady_tokens_per_s for r in runs]
        cpu_per_token = median([r.cpu_us_per_token for r in runs]) / 1e6
        # a long run lies between: its start-up is amortized, its steady rate is not reached
        # by the work done before the first window commits
        here = (
            f"{KIMI_RUN_TOKENS / median(steady) / 3600:.2f}–{KIMI_RUN_TOKENS / wall / 3600:.2f} h"
        )
        cores16_h = KIMI_RUN_TOKENS * cpu_per_token / CORES_16 / 3600
        spread = f"({min(steady):,.0f}–{max(steady):,.0f})"
        print(
            f"{n:>7}  {median([r.seconds for r in runs]):6.1f}  {wall:>15,.0f}  "
            f"{wall / base_wall:5.2f}  {median(steady):>9,.0f} {spread:<22} "
            f"{cpu_per_token * 1e6:12.2f}  {median([r.peak_rss_mb for r in runs]):11.0f}  "
            f"{here:>24}  {cores16_h:15.2f} h"
        )


if __name__ == "__main__":
    main()
