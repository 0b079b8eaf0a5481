"""Replay throughput with 1, 2 and 4 replay workers on one dataset version, side by side in one
run, and the projected time to rebuild the last Kimi run (1.87B tokens, 902,087 samples) on
this machine and on a 16-core one (issue 12, target 2).

    flock /tmp/draftgen-heavy.lock .venv/bin/python tests/benchmarks/bench_replay.py \\
        [--completions N] [--workers 1,2,4] [--repeats 3] [--quick] \\
        [--warm-only] [--cpu-quota 0.25]

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

`--cpu-quota C` (warm runs; root and the cgroup v1 `cpu` controller, `cgroups.py`) gives every
worker its own budget of C cores from its start (a group each, 25,000 of every 100,000 µs at
0.25), so that N workers have N budgets on a 2-core machine: the broker, the producing
benchmark and the seal are outside the groups. With caps, the default completions are enough
for 4 capped workers to take over a minute, so that start and end do not dominate. The end is
polled every 0.2 s (one admin client), the figures of each run are: CPU use of the budgets,
throttled time, windows written and superseded (redone after a rebalance), epochs, and
the spread of the workers' last commits. Without caps the workers share the 2 cores, and the
ratios show this machine's limit, not scaling.

The 16-core projection divides the tokens by the workers' CPU time per token spread over 16
cores: it assumes a worker per two cores (a worker's encoder uses two), the broker and S3 on
other machines (as in a deployment; here they share the two cores), and partitions ≥ workers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import re
import shlex
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from compose.process import ManagedProcess
from compose.stack import LocalStack
from compose.tiny_tokenizers import build_qwen36_tokenizer
from sinks.shards import ShardStore
from streams.core.settings import COMPLETIONS, KafkaSettings
from streams.core.topics import ensure_topics
from streams.tokenize.encoder import TWIN_READY
from streams.tools.seal import seal
from tests.benchmarks.bench_tokenize import Measure, make_data, measure, write_data
from tests.benchmarks.cgroups import CpuCaps, CpuGroup, Throttling, available, cpu_caps
from tests.benchmarks.proc import cpu_s, peak_rss_mib
from tests.benchmarks.replay_produce import (
    PARTITIONS,
    Keyed,
    keyed_records,
    produce,
    produce_fast,
    warmup_records,
)
from tests.benchmarks.replay_report import Result, WarmFigures, print_warm_run, report, report_warm
from tests.integration.probes import stable_members
from tests.polling import wait_for

# the default size of a capped warm run: the largest worker count at the cap runs this long,
# from the CPU a token costs capped (1.7–2.0 µs measured) and the tokens of a completion
CAPPED_RUN_S = 64.0
CAPPED_CPU_US_PER_TOKEN = 1.9
TOKENS_PER_COMPLETION = 1662
# warm runs: completions a partition through the workers before the clock starts
WARMUP_PER_PARTITION = 2
# warm-only runs: distinct completions made, the rest are copies under new prompt ids
MAX_DISTINCT = 2000
ADOPTED = re.compile(r"partition (\d+): adopted at offset (\d+) in epoch (\d+)")


async def _timed(
    kafka: KafkaSettings, group: str, records: list[Keyed], timeout_s: float
) -> tuple[float, dict[int, int], dict[int, float], int]:
    """Produce, then poll the group's committed offsets every 0.2 s (one admin client; `seal`
    polls every 2 s) until all are committed. Returns (producing s, committed offsets, per
    partition the seconds until it was caught up, the lag when producing ended); seconds
    are counted from the first send."""
    topic = kafka.topic(COMPLETIONS)
    started = time.monotonic()
    ends = await produce_fast(kafka, records)
    producing_s = time.monotonic() - started
    admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
    await admin.start()
    done: dict[int, float] = {}
    lag_after_producing = -1
    try:
        while True:
            offsets = await admin.list_consumer_group_offsets(group)
            now = time.monotonic() - started
            committed = {tp.partition: m.offset for tp, m in offsets.items() if tp.topic == topic}
            lag = sum(max(0, end - committed.get(p, 0)) for p, end in ends.items())
            if lag_after_producing < 0:
                lag_after_producing = lag
            for partition, end in ends.items():
                if partition not in done and committed.get(partition, 0) >= end:
                    done[partition] = now
            if lag == 0:
                return producing_s, committed, done, lag_after_producing
            if now > timeout_s:
                raise RuntimeError(f"not caught up after {timeout_s:.0f} s: {lag} to commit")
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


def _replay_argv(kafka: KafkaSettings, tokenizer: Path, out: Path, dataset: str) -> list[str]:
    argv = ["replay", "--tokenizer-dir", str(tokenizer), "--out", str(out), "--dataset", dataset]
    argv += ["--bootstrap", kafka.bootstrap, "--topic-prefix", kafka.topic_prefix]
    argv += ["--partitions", str(PARTITIONS), "--idle-flush", "2", "--heartbeat-interval", "0"]
    # warm runs start before the completions exist: the benchmark says when it has caught up
    return [*argv, "--follow"]


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
    records: list[Keyed],
    caps: CpuCaps | None = None,
    warmup: int = 0,
    worker_args: Sequence[str] = (),
) -> Result:
    """Workers started on empty topics of their own (each in its CPU group from its start,
    with `caps`), joined and with their encoder ready; then the completions are produced by
    this process (outside the groups). Timed from the first send to the version caught up;
    CPU is the workers' over that time. `warmup`: that many completions per partition
    (not counted) go through the workers before the clock starts."""
    kafka = kafka.model_copy(update={"topic_prefix": f"{kafka.topic_prefix}w{workers}r{run}-"})
    asyncio.run(ensure_topics(kafka))
    dataset = f"warm-{workers}-{run}"
    store = ShardStore(str(out), dataset)
    argv = ["--log-level", "INFO", *_replay_argv(kafka, tokenizer, out, dataset)]  # ready line
    argv += worker_args
    procs: list[ManagedProcess] = []
    groups: list[CpuGroup] = []
    try:
        for i in range(workers):
            procs.append(stack.start_worker(f"{dataset}-{i}", argv))
            if caps is not None and procs[-1].pid is not None:
                groups.append(caps.cap(procs[-1].pid, f"{dataset}-{i}"))
        group = f"draftgen-tokenize-{dataset}"
        spawned = time.monotonic()
        encoder = not {"--no-drift", "--no-measure-drift"} & set(worker_args)
        wait_for(
            lambda: _ready(procs, kafka, group, encoder), 600, "the workers joined, encoders ready"
        )
        ready_s = time.monotonic() - spawned
        pids = [p.pid for p in procs if p.pid is not None]
        warm_samples = warm_tokens = 0
        warm_cpu0 = sum(cpu_s(pid) for pid in pids)
        if warmup:
            # a few completions on every partition, committed before the clock: the workers
            # have adopted their partitions and written a shard (the first one imports pandas
            # through pyarrow: seconds of CPU)
            _, warm_offsets, _, _ = asyncio.run(
                _timed(kafka, kafka.group(group), warmup_records(records, warmup), 600)
            )
            # counted, not sealed: a sealed version stops its workers (README, failure table)
            warm_samples, warm_tokens = _settled(store, warm_offsets)
        warmup_cpu_s = (sum(cpu_s(pid) for pid in pids) - warm_cpu0) / len(pids)
        idle0 = sum(cpu_s(pid) for pid in pids)
        time.sleep(2.0)  # a worker's own cost while it waits: heartbeats, timers, fetches
        idle_cpu_per_s = (sum(cpu_s(pid) for pid in pids) - idle0) / 2.0 / len(pids)
        cpu0 = [cpu_s(pid) for pid in pids]
        throttled0 = [g.throttling() for g in groups]
        wall0 = time.time()
        producing_s, committed, done, lag = asyncio.run(
            _timed(kafka, kafka.group(group), records, 3600)
        )
        seconds = max(done.values())
        cpu = [cpu_s(pid) - c for pid, c in zip(pids, cpu0, strict=True)]
        throttling = sum(
            (g.throttling() - t for g, t in zip(groups, throttled0, strict=True)), Throttling()
        )
        rss = max(peak_rss_mib(pid) for pid in pids)
        logs = [p.log_path.read_text(errors="replace") for p in procs]
    finally:
        for proc in procs:
            proc.stop()
    manifest = store.seal(committed)
    markers = [m for m in store.markers() if m.written_at >= wall0]  # of the timed run
    superseded = [m for m in store.committed().superseded if m.written_at >= wall0]
    extra = WarmFigures(
        quota=caps.quota_cores if caps is not None else None,
        worker_cpu_s=cpu,
        throttling=throttling,
        idle_cpu_per_s=idle_cpu_per_s,
        lag_after_producing=lag,
        windows=len(markers),
        superseded=len(superseded),
        epochs=sorted({m.epoch for m in markers}),
        readopted=sum(int(o) > 0 for log in logs for _, o, _ in ADOPTED.findall(log)),
        finished_s=_finished(logs, done),
        rows_per_window=sum(m.rows for m in markers) / max(len(markers), 1),
        warmup=warm_samples,
        ready_s=ready_s,
        warmup_cpu_s=warmup_cpu_s,
    )
    return Result(
        workers,
        seconds,
        seconds,
        manifest.samples - warm_samples,
        manifest.tokens - warm_tokens,
        sum(cpu),
        rss,
        producing_s,
        extra,
    )


def _settled(store: ShardStore, offsets: dict[int, int]) -> tuple[int, int]:
    """Samples and tokens settled below `offsets`, as `seal` would count them."""
    resolution = store.committed(offsets, keep_ids=False)
    tokens = sum(
        m.tokens - sum(m.row_tokens[i] for i in resolution.exclude.get(m.key, []))
        for m in resolution.windows
    )
    return resolution.sample_count, tokens


def _finished(logs: list[str], done: dict[int, float]) -> list[float]:
    """Per worker, when the last of its partitions (its latest adoptions) was caught up."""
    owner: dict[int, tuple[int, int]] = {}  # partition → (epoch, worker) of the latest
    for worker, log in enumerate(logs):
        for partition, _, epoch in ADOPTED.findall(log):
            latest = owner.get(int(partition), (-1, -1))
            owner[int(partition)] = max(latest, (int(epoch), worker))
    last: dict[int, float] = {}
    for partition, at in done.items():
        if partition in owner:
            worker = owner[partition][1]
            last[worker] = max(last.get(worker, 0.0), at)
    return sorted(last.values())


def _ready(
    procs: list[ManagedProcess], kafka: KafkaSettings, group: str, encoder: bool = True
) -> bool:
    for proc in procs:
        if not proc.alive():
            raise RuntimeError(f"a worker exited:\n{proc.tail()}")
    # a worker that measures no drift encodes nothing with the server's ids: no twin to wait for
    if encoder and not all(TWIN_READY in p.log_path.read_text(errors="replace") for p in procs):
        return False
    return asyncio.run(stable_members(kafka, group)) >= len(procs)


def main(argv: list[str] | None = None) -> dict[int, list[Result]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--completions",
        type=int,
        help="default 6000; with --cpu-quota, enough for the most workers capped to take "
        f"~{CAPPED_RUN_S:.0f} s",
    )
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes")
    parser.add_argument("--warm-only", action="store_true", help="no cold runs, no baseline")
    parser.add_argument(
        "--warmup",
        type=int,
        default=WARMUP_PER_PARTITION,
        metavar="N",
        help="warm runs: N completions a partition through the workers before the clock "
        "(not counted; 0: none, the clock then includes the first shard's imports)",
    )
    parser.add_argument(
        "--worker-args",
        default="",
        metavar="ARGS",
        help='warm runs: more flags for the replay workers, e.g. "--max-open-bytes 1073741824"',
    )
    parser.add_argument(
        "--cpu-quota",
        type=float,
        metavar="CORES",
        help="warm runs: each worker capped at CORES (cgroup v1 cpu controller, root)",
    )
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",")]
    if args.completions is None:
        args.completions = 6000
        if args.cpu_quota:
            tokens = CAPPED_RUN_S * max(counts) * args.cpu_quota / (CAPPED_CPU_US_PER_TOKEN / 1e6)
            args.completions = math.ceil(tokens / TOKENS_PER_COMPLETION / 1000) * 1000
    if args.quick:
        args.completions, args.workers, args.repeats = 60, "1,2", 1
        counts = [1, 2]
    caps_ok = available() if args.cpu_quota else None
    if caps_ok is not None and not caps_ok:
        print(
            f"cpu caps unavailable ({caps_ok.why}): the workers run uncapped on "
            f"{os.cpu_count()} cores shared with the broker and the producer; the ratios show "
            "this machine's limit, not scaling",
            flush=True,
        )
    quota = args.cpu_quota if caps_ok else None
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
            # warm only: at most MAX_DISTINCT distinct completions (making one costs ~15 ms),
            # copied under new prompt ids up to the count
            distinct = min(args.completions, MAX_DISTINCT) if args.warm_only else args.completions
            records, texts = make_data(tokenizer, distinct)
            keyed = keyed_records(records, args.completions)
            baseline: list[Measure] = []
            data = root / "data.json"
            if not args.warm_only:
                write_data(data, tokenizer, records, texts)
                asyncio.run(produce(kafka, records))
            del texts
            for run in range(args.repeats):
                if not args.warm_only:
                    # alternating: encode_batch_fast on the same texts, then every worker count
                    baseline.append(measure("encode_batch_fast", data, len(records)))
                    for n in counts:
                        results[n].append(
                            run_one(stack, kafka, tokenizer, root / "out", n, str(run))
                        )
                for n in counts:
                    with cpu_caps(quota) if quota else _no_caps() as caps:
                        result = run_warm(
                            stack,
                            kafka,
                            tokenizer,
                            root / "out",
                            n,
                            str(run),
                            keyed,
                            caps,
                            args.warmup,
                            shlex.split(args.worker_args),
                        )
                    warm[n].append(result)
                    print_warm_run(result)
    if not args.warm_only:
        report(results, baseline, args)
    report_warm(warm, args, quota)
    return results


@contextlib.contextmanager
def _no_caps() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    main()
