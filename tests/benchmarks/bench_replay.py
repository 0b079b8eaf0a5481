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
throttled time, windows written and superseded (redone after a rebalance), generations, and
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
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

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
from tests.benchmarks.cgroups import CpuCaps, CpuGroup, Throttling, available, cpu_caps
from tests.benchmarks.proc import cpu_s, peak_rss_mib
from tests.integration.probes import stable_members
from tests.polling import wait_for

PARTITIONS = 16
KIMI_RUN_TOKENS = 1_870_000_000
KIMI_RUN_SAMPLES = 902_087
CORES_16 = 16
# the default size of a capped warm run: the largest worker count at the cap runs this long,
# from the CPU a token costs capped (1.7–2.0 µs measured) and the tokens of a completion
CAPPED_RUN_S = 64.0
CAPPED_CPU_US_PER_TOKEN = 1.9
TOKENS_PER_COMPLETION = 1662
# warm runs: completions a partition through the workers before the clock starts
WARMUP_PER_PARTITION = 2
# warm-only runs: distinct completions made, the rest are copies under new prompt ids
MAX_DISTINCT = 2000
ADOPTED = re.compile(r"partition (\d+): adopted at offset (\d+) in generation (\d+)")


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
    extra: WarmFigures | None = None

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


@dataclass
class WarmFigures:
    """What a warm run's time went to, besides the tokens."""

    quota: float | None  # cores per worker, None: uncapped
    worker_cpu_s: list[float]  # each worker's user+system seconds over the run
    throttling: Throttling  # summed over the workers' groups, over the run
    idle_cpu_per_s: float  # a worker's CPU per second joined and idle, before the run
    lag_after_producing: int  # completions not yet committed when the last was acked
    windows: int  # markers written
    superseded: int  # of those, overlapped by a newer writer's (redone)
    generations: list[int] = field(default_factory=list)  # of the windows written
    readopted: int = 0  # partitions adopted again during the run (a rebalance)
    # seconds from the start to each worker's last partition being caught up
    finished_s: list[float] = field(default_factory=list)
    rows_per_window: float = 0.0
    warmup: int = 0  # completions through the workers before the clock (not counted)
    ready_s: float = 0.0  # from the spawn to joined with the encoder ready (capped too)
    warmup_cpu_s: float = 0.0  # a worker's CPU for the warm-up completions

    def budget_use(self, seconds: float) -> float:
        """The workers' CPU over their budgets (or over the machine when uncapped)."""
        cores = self.quota or (os.cpu_count() or 1) / len(self.worker_cpu_s)
        return sum(self.worker_cpu_s) / (cores * len(self.worker_cpu_s) * seconds)


Keyed = tuple[bytes, bytes, int | None]  # key, value, partition (None: by the key)


def _keyed(records: list[bytes], count: int | None = None) -> list[Keyed]:
    """(key, value) as the generate stage sends them: keyed by prompt_id, so every run puts
    the same completions on the same partitions. `count` beyond the distinct records: copies
    under new prompt ids (the text is what costs, not its novelty). Encoded before any clock
    starts."""
    count = len(records) if count is None else count
    keyed: list[Keyed] = []
    for index in range(count):
        record = orjson.loads(records[index % len(records)])
        if index >= len(records):
            record["prompt_id"] = f"p{index:07d}"
        keyed.append((str(record["prompt_id"]).encode(), orjson.dumps(record), None))
    return keyed


def _warmup(records: list[Keyed], per_partition: int) -> list[Keyed]:
    """Completions under prompt ids of their own, `per_partition` on every partition."""
    chosen = []
    for index in range(PARTITIONS * per_partition):
        record = orjson.loads(records[index % len(records)][1])
        record["prompt_id"] = f"warmup-{index:05d}"
        chosen.append((record["prompt_id"].encode(), orjson.dumps(record), index % PARTITIONS))
    return chosen


async def _produce_fast(kafka: KafkaSettings, records: list[Keyed]) -> dict[int, int]:
    """Sends pre-encoded records in large batches; returns each partition's end offset."""
    producer = AIOKafkaProducer(
        **kafka.aiokafka_kwargs(),
        linger_ms=5,
        max_batch_size=1 << 20,
        max_request_size=kafka.max_message_bytes,
    )
    await producer.start()
    try:
        topic = kafka.topic(COMPLETIONS)
        sends = [
            await producer.send(topic, value, key=key, partition=partition)
            for key, value, partition in records
        ]
        sent = await asyncio.gather(*sends)
    finally:
        await producer.stop()
    ends: dict[int, int] = {}
    for meta in sent:
        ends[meta.partition] = max(ends.get(meta.partition, 0), meta.offset + 1)
    return ends


async def _timed(
    kafka: KafkaSettings, group: str, records: list[Keyed], timeout_s: float
) -> tuple[float, dict[int, int], dict[int, float], int]:
    """Produce, then poll the group's committed offsets every 0.2 s (one admin client; `seal`
    polls every 2 s) until all are committed. Returns (producing s, committed offsets, per
    partition the seconds until it was caught up, the lag when producing ended); seconds
    are counted from the first send."""
    topic = kafka.topic(COMPLETIONS)
    started = time.monotonic()
    ends = await _produce_fast(kafka, records)
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
        wait_for(lambda: _ready(procs, kafka, group), 600, "the workers joined, encoders ready")
        ready_s = time.monotonic() - spawned
        pids = [p.pid for p in procs if p.pid is not None]
        warm_samples = warm_tokens = 0
        warm_cpu0 = sum(cpu_s(pid) for pid in pids)
        if warmup:
            # a few completions on every partition, committed before the clock: the workers
            # have adopted their partitions and written a shard (the first one imports pandas
            # through pyarrow: seconds of CPU)
            _, warm_offsets, _, _ = asyncio.run(
                _timed(kafka, kafka.group(group), _warmup(records, warmup), 600)
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
        generations=sorted({m.generation for m in markers}),
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
    owner: dict[int, tuple[int, int]] = {}  # partition → (generation, worker) of the latest
    for worker, log in enumerate(logs):
        for partition, _, generation in ADOPTED.findall(log):
            latest = owner.get(int(partition), (-1, -1))
            owner[int(partition)] = max(latest, (int(generation), worker))
    last: dict[int, float] = {}
    for partition, at in done.items():
        if partition in owner:
            worker = owner[partition][1]
            last[worker] = max(last.get(worker, 0.0), at)
    return sorted(last.values())


def _ready(procs: list[ManagedProcess], kafka: KafkaSettings, group: str) -> bool:
    for proc in procs:
        if not proc.alive():
            raise RuntimeError(f"a worker exited:\n{proc.tail()}")
    if not all(TWIN_READY in p.log_path.read_text(errors="replace") for p in procs):
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
            keyed = _keyed(records, args.completions)
            baseline: list[Measure] = []
            data = root / "data.json"
            if not args.warm_only:
                write_data(data, tokenizer, records, texts)
                asyncio.run(_produce(kafka, records))
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
                    _print_warm_run(result)
    if not args.warm_only:
        report(results, baseline, args)
    report_warm(warm, args, quota)
    return results


@contextlib.contextmanager
def _no_caps() -> Iterator[None]:
    yield None


def _print_warm_run(r: Result) -> None:
    """One run's figures as soon as it ends (the table comes at the end)."""
    x = r.extra
    assert x is not None
    print(
        f"  {r.workers} workers (ready in {x.ready_s:.0f} s; {x.warmup} completions to warm "
        f"up, {x.warmup_cpu_s:.1f} CPU s a worker): {r.seconds:.1f} s, {r.tokens:,} tokens, "
        f"producing "
        f"{r.producing_s:.1f} s (lag then {x.lag_after_producing}), workers' CPU "
        f"{' '.join(f'{c:.1f}' for c in x.worker_cpu_s)} s, budget use "
        f"{x.budget_use(r.seconds):.0%}, idle {x.idle_cpu_per_s * 1000:.0f} ms/s a worker, "
        f"throttled {x.throttling.throttled}/{x.throttling.periods} periods "
        f"({x.throttling.throttled_s:.1f} s), windows {x.windows} "
        f"({x.rows_per_window:.0f} rows each), superseded {x.superseded}, generations "
        f"{x.generations}, re-adopted {x.readopted}, workers done at "
        f"{' '.join(f'{t:.1f}' for t in x.finished_s)} s",
        flush=True,
    )


def report_warm(
    warm: dict[int, list[Result]], args: argparse.Namespace, quota: float | None
) -> None:
    median = statistics.median
    first = warm[min(warm)]
    base = median([r.tokens_per_s for r in first])
    base_cpu = median([r.cpu_us_per_token for r in first])
    base_use = median([r.extra.budget_use(r.seconds) for r in first if r.extra])
    capped = f"each worker capped at {quota} core" if quota else "uncapped"
    if args.worker_args:
        capped += f", workers given {args.worker_args}"
    print(
        f"warm workers, {capped} (joined, encoders ready, {args.warmup} completions a "
        f"partition through them, then the {args.completions} completions produced): from "
        "the first send to the version caught up"
    )
    print(
        "workers  s (min–max)          tokens/s   ratio  eff.  producing s  CPU µs/token  "
        "budget use  throttled s  windows  superseded  last worker − first s  "
        "1.87B here  1.87B on 16 cores"
    )
    for n, runs in warm.items():
        seconds = [r.seconds for r in runs]
        rate = median([r.tokens_per_s for r in runs])
        cpu_per_token = median([r.cpu_us_per_token for r in runs]) / 1e6
        spread = f"{median(seconds):.1f} ({min(seconds):.1f}–{max(seconds):.1f})"
        extras = [r.extra for r in runs if r.extra is not None]
        use = median([r.extra.budget_use(r.seconds) for r in runs if r.extra])
        throttled = median([x.throttling.throttled_s for x in extras])
        windows = median([x.windows for x in extras])
        superseded = median([x.superseded for x in extras])
        tail = median([x.finished_s[-1] - x.finished_s[0] for x in extras if x.finished_s])
        print(
            f"{n:>7}  {spread:<18} {rate:>10,.0f}  {rate / base:5.2f}  {rate / base / n:4.2f}  "
            f"{median([r.producing_s for r in runs]):11.1f}  {cpu_per_token * 1e6:12.2f}  "
            f"{use:10.0%}  {throttled:11.1f}  {windows:7.0f}  {superseded:10.0f}  "
            f"{tail:21.1f}  {KIMI_RUN_TOKENS / rate / 3600:8.2f} h  "
            f"{KIMI_RUN_TOKENS * cpu_per_token / CORES_16 / 3600:15.2f} h"
        )
    if quota:
        print(
            "eff. = ratio / workers = (budget use ÷ 1 worker's) × (1 worker's CPU per token ÷ "
            f"this one's); 1 worker: budget use {base_use:.0%}, {base_cpu:.2f} µs/token"
        )
    else:
        print(
            "uncapped: the workers share the machine's cores with the broker and the producer, "
            "so the ratios show this machine's limit, not scaling"
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
