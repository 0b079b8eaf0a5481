"""Tokenize workers behind live generate workers: `draftgen run --tokenize-workers N` for N = 1,
2, 4, each tokenize worker capped at its own CPU budget, measured side by side in one run.

    flock /tmp/draftgen-heavy.lock .venv/bin/python tests/benchmarks/bench_run_scaling.py \\
        [--workers 1,2,4] [--cpu-quota 0.02] [--prompts 600] [--servers 3] [--json F]

One Kafka broker and the emulated servers (instant decoding, log-normal outputs of
~--mean-output-tokens, real Qwen3.6 vocabulary) are started here and shared by the runs; each
run is `draftgen run --bootstrap … --server URL… --tokenize-workers N` on topics and a dataset
of its own, writing shards to a local directory. Every tokenize worker `run` spawns goes into a
cgroup v1 `cpu` group of its own as soon as it appears (tests/benchmarks/cgroups.py), uncapped
until all of them have built their encoder, then capped; `run`, its generate workers, the
servers and the broker stay uncapped, so generation outruns the capped tokenize stage.

Figures per run: "drained", every token over the time from the cap to the last commit marker
(what the capped stage did, whatever its window sizes); "steady", the tokens committed between
10% and 90% of the version's tokens over that time, which says little when windows are large
(a window's marker is written only at its end); the completions' first and last write times,
to show generation kept ahead. Without root or a cgroup v1 `cpu` controller the workers run
uncapped and the result says it shows no scaling.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from compose.stack import LocalStack, draftgen_argv
from compose.tiny_tokenizers import build_qwen36_tokenizer
from sinks.shards import ShardStore
from streams.core.settings import COMPLETIONS, KafkaSettings
from streams.core.topic_reader import TopicReader
from streams.tokenize.encoder import TWIN_READY
from tests.benchmarks.cgroups import CpuCaps, CpuGroup, Throttling, available, cpu_caps

STEADY = (0.10, 0.90)  # the share of the version's tokens between which the rate is taken


@dataclass
class RunResult:
    workers: int
    seconds: float  # the whole `draftgen run`, start-up included
    samples: int
    tokens: int
    steady_s: float
    steady_tokens: int
    capped_s: float  # from the run's start: the workers ready and capped
    first_completion_s: float
    last_completion_s: float
    last_marker_s: float
    windows: int
    generations: int
    budget_used: float  # throttled periods / periods of the capped workers: 1.0 = always busy
    throttled_s: float

    @property
    def generated_tokens_per_s(self) -> float:
        """How fast the completions came (an upper bound on what the tokenize stage can show)."""
        span = self.last_completion_s - self.first_completion_s
        return self.tokens / span if span > 0 else 0.0

    @property
    def drain_tokens_per_s(self) -> float:
        """Every token over the time from the cap to the last marker: what the capped stage
        did, windows of any size included (a window's marker comes only when it is written)."""
        span = self.last_marker_s - self.capped_s
        return self.tokens / span if span > 0 else 0.0

    @property
    def steady_tokens_per_s(self) -> float:
        return self.steady_tokens / self.steady_s if self.steady_s > 0 else 0.0


def _prompts(path: Path, count: int) -> Path:
    with path.open("wb") as handle:
        for index in range(count):
            text = f"[{index}] explain write-ahead logs ({uuid.uuid4().hex[:8]})"
            handle.write(orjson.dumps({"messages": [{"role": "user", "content": text}]}) + b"\n")
    return path


def _children(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        with contextlib.suppress(FileNotFoundError):
            for task in Path(f"/proc/{parent}/task").iterdir():
                with contextlib.suppress(FileNotFoundError):
                    kids = (task / "children").read_text().split()
                    found += [int(k) for k in kids]
                    todo += [int(k) for k in kids]
    return found


def _is_tokenize_worker(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return False
    return b"worker" in argv and b"tokenize" in argv


@dataclass
class Capped:
    groups: list[CpuGroup] = field(default_factory=list)
    at_cap: Throttling = field(default_factory=Throttling)  # the groups' cpu.stat when capped
    capped_at: float = 0.0  # time.time() when the quota was set

    def throttling(self) -> Throttling:
        """Since the quota was set."""
        return sum((g.throttling() for g in self.groups), Throttling()) - self.at_cap


@contextlib.contextmanager
def _capping(
    run_pid: int, logs: Path, workers: int, caps: CpuCaps | None, quota: float
) -> Iterator[Capped]:
    """Moves each tokenize worker under `run_pid` into a group of its own as it appears, at
    first uncapped; once all `workers` have logged that their encoder is ready, every group
    gets `quota`. Their imports and encoder build (CPU seconds: minutes at 0.1 core) stay out
    of the measurement, which starts with the steady state anyway."""
    stop = threading.Event()
    capped = Capped()

    def ready() -> bool:
        found = [p.read_text(errors="replace") for p in logs.glob("tokenize-*.log")]
        return len(found) >= workers and all(TWIN_READY in text for text in found)

    def watch() -> None:
        seen: set[int] = set()
        done = False
        while not stop.is_set():
            for pid in _children(run_pid):
                if pid not in seen and _is_tokenize_worker(pid):
                    seen.add(pid)
                    if caps is not None:
                        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                            caps.cap(pid, f"tokenize-{pid}")
            if caps is not None and not done and len(caps.groups) >= workers and ready():
                caps.set_quota(quota)
                capped.groups = list(caps.groups)
                capped.at_cap = sum((g.throttling() for g in capped.groups), Throttling())
                capped.capped_at = time.time()
                done = True
                print(f"  {workers} tokenize workers ready: capped at {quota} core each")
            stop.wait(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield capped
    finally:
        stop.set()
        thread.join()


async def _write_span_ms(kafka: KafkaSettings, topic: str) -> tuple[int, int]:
    """The timestamps of the oldest and the newest record of `topic` (CreateTime, ms)."""
    reader = TopicReader(kafka, topic)
    times: list[int] = []

    try:
        if await reader.open():
            await reader.read_to_end(lambda record: times.append(record.timestamp))
        return min(times, default=0), max(times, default=0)
    finally:
        await reader.close()


def _steady(markers: list[tuple[float, int]]) -> tuple[float, int]:
    """(seconds, tokens) between the markers at STEADY[0] and STEADY[1] of all tokens."""
    total = sum(tokens for _, tokens in markers)
    done, start, start_tokens = 0, None, 0
    for at, tokens in sorted(markers):
        done += tokens
        if start is None and done >= STEADY[0] * total:
            start, start_tokens = at, done
        if done >= STEADY[1] * total:
            assert start is not None
            return at - start, done - start_tokens
    return 0.0, 0


def run_one(
    workdir: Path,
    bootstrap: str,
    servers: list[str],
    tokenizer: Path,
    source: Path,
    workers: int,
    caps: CpuCaps | None,
    quota: float,
    timeout_s: float,
) -> RunResult:
    prefix = f"rs{workers}-{uuid.uuid4().hex[:6]}-"
    out, dataset = workdir / "out", f"scale-{workers}"
    argv = draftgen_argv(
        "--log-level", "INFO",  # the workers' ready lines
        "run",
        "--bootstrap", bootstrap,
        "--topic-prefix", prefix,
        "--partitions", "16",
        "--tokenizer", str(tokenizer),
        "--tokenize-workers", str(workers),
        "--out", str(out),
        "--dataset", dataset,
        "--workdir", str(workdir / dataset),
        "--timeout", str(timeout_s),
        *(arg for url in servers for arg in ("--server", url)),
        str(source),
    )  # fmt: skip
    started = time.time()
    with (workdir / f"{dataset}.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        with _capping(proc.pid, workdir / dataset / "logs", workers, caps, quota) as capped:
            code = proc.wait(timeout=timeout_s + 120)
            throttling = capped.throttling()
            capped_at = capped.capped_at or started
    seconds = time.time() - started
    if code != 0:
        raise RuntimeError(f"draftgen run exited {code}: see {workdir / f'{dataset}.log'}")
    store = ShardStore(str(out), dataset)
    markers = store.markers()
    steady_s, steady_tokens = _steady([(m.written_at, m.tokens) for m in markers])
    kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=prefix)
    first_ms, last_ms = asyncio.run(_write_span_ms(kafka, kafka.topic(COMPLETIONS)))
    figures = store.committed(keep_ids=False)
    return RunResult(
        workers=workers,
        seconds=seconds,
        samples=figures.sample_count,
        tokens=sum(m.tokens for m in figures.windows),
        steady_s=steady_s,
        steady_tokens=steady_tokens,
        capped_s=capped_at - started,
        first_completion_s=first_ms / 1000 - started,
        last_completion_s=last_ms / 1000 - started,
        last_marker_s=max(m.written_at for m in markers) - started,
        windows=len(markers),
        generations=len({m.generation for m in markers}),
        budget_used=throttling.throttled / max(throttling.periods, 1),
        throttled_s=throttling.throttled_s,
    )


def main(argv: list[str] | None = None) -> list[RunResult]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4", help="tokenize workers per run")
    parser.add_argument("--cpu-quota", type=float, default=0.02, help="cores per tokenize worker")
    parser.add_argument("--prompts", type=int, default=600)
    parser.add_argument("--servers", type=int, default=3, help="emulated servers (uncapped)")
    parser.add_argument("--mean-output-tokens", type=int, default=2000)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",")]
    can_cap = available()
    if not can_cap:
        print(f"bench: cannot cap CPU ({can_cap.why}); running uncapped: no scaling shown")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-run-scaling-"))
    tokenizer = build_qwen36_tokenizer(workdir / "qwen36", vocab="qwen")
    source = _prompts(workdir / "prompts.jsonl", args.prompts)
    results: list[RunResult] = []
    with LocalStack(workdir / "stack") as stack:
        bootstrap = stack.start_kafka()
        options = [
            *("--tokens-per-s", "0", "--max-running-requests", "64"),
            *("--mean-output-tokens", str(args.mean_output_tokens)),
            *("--max-output-tokens", str(8 * args.mean_output_tokens)),
        ]
        servers = [
            stack.start_emulator(tokenizer, *options, "--seed", str(i), name=f"emulator-{i}")
            for i in range(args.servers)
        ]
        for workers in counts:
            # groups made uncapped (every core), capped once the workers are ready
            with cpu_caps(os.cpu_count() or 1) if can_cap else contextlib.nullcontext() as caps:
                result = run_one(
                    workdir,
                    bootstrap,
                    servers,
                    tokenizer,
                    source,
                    workers,
                    caps,
                    args.cpu_quota,
                    args.timeout,
                )
                results.append(result)
                print(_line(result, results[0]), flush=True)
    print(table(results, args.cpu_quota if can_cap else None))
    if args.json:
        args.json.write_text(orjson.dumps([asdict(r) for r in results]).decode())
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def _line(r: RunResult, base: RunResult) -> str:
    return (
        f"{r.workers} tokenize workers: {r.samples} samples, {r.tokens:,} tokens"
        f" in {r.seconds:.1f}s;"
        f" drained at {r.drain_tokens_per_s:,.0f} tokens/s"
        f" ({r.drain_tokens_per_s / base.drain_tokens_per_s:.2f}x), steady"
        f" {r.steady_tokens_per_s:,.0f};"
        f" completions from {r.first_completion_s:.1f}s to {r.last_completion_s:.1f}s"
        f" ({r.generated_tokens_per_s:,.0f} tokens/s), last marker at {r.last_marker_s:.1f}s"
    )


def table(results: list[RunResult], quota: float | None) -> str:
    base = results[0].drain_tokens_per_s
    rows = [
        f"tokenize workers each capped at {quota} core" if quota else "uncapped: no scaling shown",
        "| tokenize workers | run s | samples | tokens | drained tokens/s | × 1 worker | efficiency"
        " | steady tokens/s"
        " | generated tokens/s | last completion s | last marker s | budget used | windows"
        " | generations |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = r.drain_tokens_per_s / base if base else 0.0
        rows.append(
            f"| {r.workers} | {r.seconds:.1f} | {r.samples:,} | {r.tokens:,}"
            f" | {r.drain_tokens_per_s:,.0f} | {ratio:.2f} | {ratio / r.workers:.2f}"
            f" | {r.steady_tokens_per_s:,.0f}"
            f" | {r.generated_tokens_per_s:,.0f} | {r.last_completion_s:.1f}"
            f" | {r.last_marker_s:.1f} | {r.budget_used:.0%}"
            f" | {r.windows} | {r.generations} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    main()
