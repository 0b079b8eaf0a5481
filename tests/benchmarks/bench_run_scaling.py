"""Tokenize workers behind live generate workers: `draftgen run --tokenize-workers N` for N = 1,
2, 4, each tokenize worker capped at its own CPU budget, measured side by side in one run.

    flock /tmp/draftgen-heavy.lock .venv/bin/python tests/benchmarks/bench_run_scaling.py \\
        [--workers 1,2,4] [--cpu-quota 0.05] [--prompts 1600] [--servers 3] [--json F]

One Kafka broker and the emulated servers (instant decoding; a pool of --pool outputs of
log-normal lengths around --mean-output-tokens written by the emulator's generator, real Qwen3.6
vocabulary, see `_output_pool`) are started here and shared by the runs; each
run is `draftgen run --bootstrap … --server URL… --tokenize-workers N` on topics and a dataset
of its own, writing shards to a local directory. Every tokenize worker `run` spawns goes into a
cgroup v1 `cpu` group of its own as soon as it appears (tests/benchmarks/cgroups.py), uncapped
until all of them have built their encoder, then capped; `run`, its generate workers, the
servers and the broker stay uncapped, so generation outruns the capped tokenize stage. The
benchmark and all it starts run in a cgroup of high CPU weight (the capped groups get the same),
so other work on the machine slows neither generation nor the capped workers' budgets.

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

from compose.emulator.generation import GenerationRequest, Generator
from compose.emulator.model import EmulatedModel
from compose.emulator.settings import EmulatorSettings
from compose.stack import LocalStack, draftgen_argv
from compose.tiny_tokenizers import build_qwen36_tokenizer
from sinks.shards import ShardStore
from streams.core.settings import COMPLETIONS, KafkaSettings
from streams.core.topic_reader import TopicReader
from streams.tokenize.encoder import TWIN_READY
from tests.benchmarks.cgroups import (
    CpuCaps,
    CpuGroup,
    Throttling,
    available,
    cpu_caps,
    priority,
)

STEADY = (0.10, 0.90)  # the share of the version's tokens between which the rate is taken


@dataclass(frozen=True)
class Window:
    """Windows cut by a row count, the same for every worker count: left to the memory budget,
    one worker holding all partitions' rows cuts many small windows and N workers few large
    ones, and at a small CPU cap the per-window cost (shard write, marker, commit) would be
    what is compared."""

    rows: int
    max_open_bytes: int
    # A capped worker comes back to a partition only after a turn over all it holds (a lone
    # worker at 0.05 core: ~2 s over 16 partitions), so a short idle flush cuts a window at
    # almost every sample, and more often the more partitions a worker holds.
    idle_flush_s: float

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DRAFTGEN_SHARD_MAX_RECORDS": str(self.rows),
            "DRAFTGEN_MAX_OPEN_BYTES": str(self.max_open_bytes),
            "DRAFTGEN_RUN_IDLE_FLUSH_S": str(self.idle_flush_s),
            "DRAFTGEN_IDLE_FLUSH_S": str(self.idle_flush_s),
        }


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
    epochs: int
    budget_used: float  # throttled periods / periods of the capped workers: 1.0 = always busy
    throttled_s: float

    @property
    def generated_tokens_per_s(self) -> float:
        """How fast the completions came (an upper bound on what the tokenize stage can show)."""
        span = self.last_completion_s - self.first_completion_s
        return self.tokens / span if span > 0 else 0.0

    @property
    def drain_tokens_per_s(self) -> float:
        """Every token over the time from the cap (or the first completion, if later) to the
        last marker: what the capped stage did, windows of any size included (a window's
        marker comes only when it is written)."""
        span = self.last_marker_s - max(self.capped_s, self.first_completion_s)
        return self.tokens / span if span > 0 else 0.0

    @property
    def steady_tokens_per_s(self) -> float:
        return self.steady_tokens / self.steady_s if self.steady_s > 0 else 0.0


def _prompt_text(index: int, pool: int) -> str:
    return f"[{index}] explain write-ahead logs ({uuid.uuid4().hex[:8]}) «pool-{index % pool:04d}»"


def _prompts(path: Path, count: int, pool: int) -> Path:
    with path.open("wb") as handle:
        for index in range(count):
            text = _prompt_text(index, pool)
            handle.write(orjson.dumps({"messages": [{"role": "user", "content": text}]}) + b"\n")
    return path


def _output_pool(path: Path, tokenizer: Path, pool: int, mean_output_tokens: int) -> Path:
    """A script of `pool` outputs, one per `«pool-NNNN»` tag, made once by the emulator's own
    generator (thinking, `</think>`, answer; log-normal lengths) for that tag's prompt.

    The emulator's generator writes its text sentence by sentence, asking the tokenizer for
    each sentence's length: ~50K tokens/s per core, so three emulators on these 2 cores could
    not outrun even a 0.1-core tokenize worker. A scripted output is one encode of a whole text
    (what the emulator then "samples"), so generation costs the HTTP and Kafka path only. Each
    text is reused by every `pool`-th prompt under its own prompt id; the tokenize stage keeps
    no cache across samples that this could flatter (its encoder's word cache is already warm
    after a few samples of this filler text either way)."""
    settings = EmulatorSettings(
        tokenizer_dir=tokenizer,
        tokens_per_s=0,
        mean_output_tokens=mean_output_tokens,
        max_output_tokens=8 * mean_output_tokens,
    )
    model = EmulatedModel(tokenizer, settings.family)
    generator = Generator(model, settings)
    eot = model.special.eot
    with path.open("wb") as handle:
        for index in range(pool):
            messages = [{"role": "user", "content": _prompt_text(index, pool)}]
            prompt = model.render(messages)
            job = GenerationRequest(prompt, len(model.encode(prompt)), None, thinking=True)
            ids = generator.generate(job).output_ids
            text = model.decode([i for i in ids if i != eot], skip_special_tokens=False)
            entry = {"match": f"«pool-{index:04d}»", "output": text}
            handle.write(orjson.dumps(entry) + b"\n")
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
    window: Window,
) -> RunResult:
    prefix = f"rs{workers}-{uuid.uuid4().hex[:6]}-"
    out, dataset = workdir / "out", f"scale-{workers}"
    argv = draftgen_argv(
        "--log-level", "INFO",  # the workers' ready lines
        "run",
        "--bootstrap", bootstrap,
        "--topic-prefix", prefix,
        "--partitions", "16",
        "--tokenizer-dir", str(tokenizer),
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
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=window.env())
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
        epochs=len({m.epoch for m in markers}),
        budget_used=throttling.throttled / max(throttling.periods, 1),
        throttled_s=throttling.throttled_s,
    )


def main(argv: list[str] | None = None) -> list[RunResult]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4", help="tokenize workers per run")
    parser.add_argument("--cpu-quota", type=float, default=0.05, help="cores per tokenize worker")
    parser.add_argument("--window-rows", type=int, default=200, help="rows a window is cut at")
    parser.add_argument("--idle-flush", type=float, default=10.0, help="seconds (see Window)")
    parser.add_argument(
        "--max-open-bytes", type=int, default=4 << 30, help="each worker's memory budget"
    )
    parser.add_argument("--prompts", type=int, default=1600)
    parser.add_argument("--servers", type=int, default=3, help="emulated servers (uncapped)")
    parser.add_argument("--mean-output-tokens", type=int, default=2000)
    parser.add_argument("--pool", type=int, default=64, help="distinct outputs, reused")
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
    source = _prompts(workdir / "prompts.jsonl", args.prompts, args.pool)
    script = _output_pool(workdir / "pool.jsonl", tokenizer, args.pool, args.mean_output_tokens)
    results: list[RunResult] = []
    window = Window(args.window_rows, args.max_open_bytes, args.idle_flush)
    with (
        priority() if can_cap else contextlib.nullcontext(),
        LocalStack(workdir / "stack") as stack,
    ):
        bootstrap = stack.start_kafka()
        options = [
            *("--tokens-per-s", "0", "--max-running-requests", "64"),
            *("--max-output-tokens", str(8 * args.mean_output_tokens)),
            *("--script", str(script)),
        ]
        servers = [
            stack.start_emulator(tokenizer, *options, "--seed", str(i), name=f"emulator-{i}")
            for i in range(args.servers)
        ]
        for workers in counts:
            # groups made uncapped (every core), capped once the workers are ready
            every_core = os.cpu_count() or 1
            capping = cpu_caps(every_core, shares=8 * 1024) if can_cap else contextlib.nullcontext()
            with capping as caps:
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
                    window,
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
        " | epochs |",
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
            f" | {r.windows} | {r.epochs} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    main()
