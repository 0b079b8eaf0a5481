"""The end of a finite run (issue 12, item 3): draftgen against a plain batch client and against
the best possible wall time for the prompts in arrival order, at 1, 4 and 8 emulated servers.

    flock /tmp/draftgen-heavy.lock .venv/bin/python tests/benchmarks/bench_tail.py \
        [--servers 1,4,8] [--repeats 3] [--prompts-per-server 128] [--json PATH] [--quick]

Starts its own Kafka broker and, per server count S, S emulated SGLang servers of `--slots`
running requests (`--max-running-requests`) decoding `--tokens-per-s` tokens/s per request,
outputs uniform in [`--min-output`, `--max-output`] tokens, all with the same seed, so a prompt
gets the same output (and takes the same time) on any server. Per S, 3 clients take the same
prompts against the same servers, alternating in order from one repeat to the next:

- `batch`: a plain batch client written here, as a careful user would write it without Kafka:
  one process, one `openai.AsyncOpenAI` per server, one semaphore per server (its
  `max_running_requests` slots); prompts are taken in arrival order, each sent to a server
  with a free slot (the first such; waiting for any when none is). It asks for the same
  request draftgen sends (template kwargs, sampling, token ids) and keeps the answers in memory.
- `draftgen`: one generate worker per server, joined and idle (static membership), then the
  prompts are published; ends when the generate group has committed every prompt (each
  completion acknowledged by Kafka and its offset committed). "last completion" is when the
  last prompt's first completion landed in `completions`.
- `draftgen cold`: the prompts are published, then the workers are started: start-up
  (process start, joining the group) included.

"Best possible" is computed by simulation: each prompt's output length (the emulator is
deterministic: the lengths the batch client got) list-scheduled in arrival order onto the
earliest free slot of S servers x `--slots` slots at `--tokens-per-s`. "Capacity" is the
time the servers would take if every slot were busy from the first request to the last.

Also measured: the requests each server received beyond one per prompt (duplicates; a
worker's probe for token ids is not counted), CPU-ms per prompt of each client's processes
(draftgen: its workers; the broker's share is shown apart) and their peak RSS (VmHWM).
`--quick` is a smoke test (2 servers, few short outputs, 1 repeat): it checks the machinery,
its timings mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.proc import cpu_s, peak_rss_mib

READY_LINE = "generating with model"


# -- the plain batch client (run in its own process: --batch-client SPEC) --------------------


async def _batch(spec: dict[str, Any]) -> dict[str, Any]:
    import httpx
    import openai

    prompts = [json.loads(line) for line in Path(spec["prompts"]).read_text().splitlines()]
    servers = spec["servers"]
    slots = spec["slots"]
    clients = []
    for url in servers:
        limits = httpx.Limits(max_connections=slots, max_keepalive_connections=slots)
        http = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(1800.0, connect=10.0))
        clients.append(openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="EMPTY", http_client=http))
    model = (await clients[0].models.list()).data[0].id
    semaphores = [asyncio.Semaphore(slots) for _ in servers]
    freed = asyncio.Event()
    tokens: list[int] = [0] * len(prompts)
    failures = 0

    async def one(index: int, server: int) -> None:
        nonlocal failures
        try:
            for _attempt in range(5):
                try:
                    response = await clients[server].chat.completions.create(
                        model=model,
                        messages=prompts[index]["messages"],
                        temperature=1.0,
                        top_p=0.95,
                        max_tokens=8192,
                        extra_body={
                            "chat_template_kwargs": {"enable_thinking": True},
                            "separate_reasoning": True,
                            "return_token_ids": True,
                        },
                    )
                except openai.APIError:
                    continue
                answers[index] = response.model_dump()
                tokens[index] = response.usage.completion_tokens if response.usage else 0
                return
            failures += 1
        finally:
            semaphores[server].release()
            freed.set()

    answers: list[Any] = [None] * len(prompts)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    started = time.time()
    tasks = []
    for index in range(len(prompts)):
        while True:  # the first server with a free slot, in arrival order
            free = next((s for s, sem in enumerate(semaphores) if not sem.locked()), None)
            if free is not None:
                break
            freed.clear()
            await freed.wait()
        await semaphores[free].acquire()
        tasks.append(asyncio.create_task(one(index, free)))
    await asyncio.gather(*tasks)
    ended = time.time()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    for client in clients:
        await client.close()
    return {
        "started": started,
        "ended": ended,
        "tokens": tokens,
        "failures": failures,
        "cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
        # not ru_maxrss: after fork+exec Linux reports the parent's high-water mark there
        "peak_rss_mib": peak_rss_mib(os.getpid()),
    }


def batch_client_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    print(json.dumps(asyncio.run(_batch(spec))))
    return 0


# -- best possible -----------------------------------------------------------------------------


def best_possible(tokens: list[int], servers: int, slots: int, tokens_per_s: float) -> float:
    """List scheduling in arrival order onto the earliest free slot; the makespan."""
    free = [0.0] * (servers * slots)
    heapq.heapify(free)
    end = 0.0
    for count in tokens:
        start = heapq.heappop(free)
        finish = start + count / tokens_per_s
        end = max(end, finish)
        heapq.heappush(free, finish)
    return end


# -- process figures ---------------------------------------------------------------------------


# -- one run -----------------------------------------------------------------------------------


@dataclass
class Run:
    client: str
    servers: int
    prompts: int
    # seconds from the first prompt sent/published to the last prompt done (committed)
    wall_s: float
    # seconds including start-up: from spawning the client's processes
    with_startup_s: float
    # draftgen: seconds to the last prompt's first completion landing in Kafka
    last_completion_s: float | None = None
    # draftgen: seconds `draftgen publish` took (its ledger read included)
    publish_s: float | None = None
    # seconds from the start to every slot of every server first busy, and last busy (then
    # the tail begins), sampled every 0.05 s; the mean share of slots busy over the run
    all_slots_busy_s: float | None = None
    last_all_busy_s: float | None = None
    busy_share: float = 0.0
    requests: int = 0
    duplicates: int = 0
    output_tokens: int = 0
    cpu_ms_per_prompt: float = 0.0
    broker_cpu_ms_per_prompt: float | None = None
    peak_rss_mib: float = 0.0
    failures: int = 0
    stolen_lines: int = 0
    tokens: list[int] = field(default_factory=list, repr=False)


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path):
        from compose.stack import LocalStack

        self.args = args
        self.workdir = workdir
        self.stack = LocalStack(workdir)
        self.bootstrap = ""
        self.tokenizer = workdir / "qwen36"

    def start(self) -> None:
        from compose.tiny_tokenizers import build_qwen36_tokenizer

        self.bootstrap = self.stack.start_kafka()
        build_qwen36_tokenizer(self.tokenizer, vocab=self.args.vocab)

    def broker_pid(self) -> int | None:
        kafka = self.stack.kafka
        return kafka.process.pid if kafka and kafka.process else None

    def emulators(self, count: int) -> list[tuple[str, Any]]:
        a = self.args
        options = [
            "--tokens-per-s",
            str(a.tokens_per_s),
            "--max-running-requests",
            str(a.slots),
            "--min-output-tokens",
            str(a.min_output),
            "--max-output-tokens",
            str(a.max_output),
            "--seed",
            "0",
        ]
        return [
            self.stack.start_emulator_process(self.tokenizer, *options, name=f"emu{count}-{i}")
            for i in range(count)
        ]

    def prompts_file(self, servers: int) -> tuple[Path, int]:
        count = self.args.prompts_per_server * servers
        path = self.workdir / f"prompts-{servers}.jsonl"
        with path.open("wb") as handle:
            for index in range(count):
                text = f"[{servers}/{index}] explain write-ahead logs, variant {index * 7919 % 997}"
                handle.write(orjson.dumps({"messages": [{"role": "user", "content": text}]}))
                handle.write(b"\n")
        return path, count

    # -- the batch client --

    def run_batch(self, urls: list[str], prompts: Path, count: int) -> Run:
        spec = self.workdir / f"batch-{uuid.uuid4().hex[:6]}.json"
        spec.write_text(
            json.dumps({"prompts": str(prompts), "servers": urls, "slots": self.args.slots})
        )
        before = _stats(urls)
        sampler = _Sampler(urls, self.args.slots)
        sampler.start()
        spawned = time.time()
        done = subprocess.run(
            [sys.executable, __file__, "--batch-client", str(spec)],
            capture_output=True,
            check=True,
            timeout=1800,
        )
        result = json.loads(done.stdout.decode().strip().splitlines()[-1])
        sampler.stop()
        after = _wait_idle(urls)
        requests = sum(a["requests"] - b["requests"] for a, b in zip(after, before, strict=True))
        return Run(
            client="batch",
            servers=len(urls),
            prompts=count,
            wall_s=result["ended"] - result["started"],
            with_startup_s=result["ended"] - spawned,
            requests=requests,
            duplicates=requests - count,
            output_tokens=_tokens(after, before),
            cpu_ms_per_prompt=result["cpu_s"] * 1000 / count,
            peak_rss_mib=result["peak_rss_mib"],
            failures=result["failures"],
            tokens=result["tokens"],
            **sampler.figures(result["started"], result["ended"]),
        )

    # -- draftgen --

    def _kafka(self) -> Any:
        from streams.core.settings import KafkaSettings

        prefix = f"t{uuid.uuid4().hex[:6]}-"
        return KafkaSettings(bootstrap=self.bootstrap, topic_prefix=prefix)

    def _start_workers(self, urls: list[str], kafka: Any) -> list[Any]:
        workers = []
        for index, url in enumerate(urls):
            argv = [
                "--log-level",
                "INFO",
                "worker",
                "generate",
                "--server",
                url,
                "--concurrency",
                "auto",
                "--bootstrap",
                kafka.bootstrap,
                "--topic-prefix",
                kafka.topic_prefix,
                "--instance-id",
                f"gen-{index}",
                *self.args.worker_arg,
            ]
            workers.append(self.stack.start_worker(f"gen{len(urls)}", argv))
        return workers

    def _wait_joined(self, workers: list[Any], kafka: Any) -> None:
        from streams.core.settings import GENERATE_GROUP
        from tests.integration.probes import stable_members

        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            for worker in workers:
                if not worker.alive():
                    raise RuntimeError(f"worker exited; see {worker.log_path}")
            ready = all(READY_LINE in w.log_path.read_text(errors="replace") for w in workers)
            if ready and asyncio.run(stable_members(kafka, GENERATE_GROUP)) >= len(workers):
                return
            time.sleep(0.2)
        raise RuntimeError("workers did not join within 180 s")

    def run_draftgen(self, urls: list[str], prompts: Path, count: int, cold: bool) -> Run:
        from producers.publish import publish
        from producers.sources import parse_source_spec
        from streams.core.topics import ensure_topics

        kafka = self._kafka()
        before = _stats(urls)
        asyncio.run(ensure_topics(kafka))
        workers: list[Any] = []
        spawned = time.time()
        if not cold:
            workers = self._start_workers(urls, kafka)
            self._wait_joined(workers, kafka)
        broker = self.broker_pid()
        broker0 = cpu_s(broker) if broker else 0.0
        cpu0 = [cpu_s(w.pid) for w in workers]
        sampler = _Sampler(urls, self.args.slots)
        sampler.start()
        started = time.time()
        spec = parse_source_spec(str(prompts))
        asyncio.run(publish(kafka, [spec], progress=False))
        published = time.time()
        if cold:
            spawned = time.time()
            workers = self._start_workers(urls, kafka)
            cpu0 = [0.0] * len(workers)
        last_completion, committed = asyncio.run(_watch_end(kafka, count, workers))
        sampler.stop()
        cpu1 = [cpu_s(w.pid) for w in workers]
        broker1 = cpu_s(broker) if broker else 0.0
        rss = max(peak_rss_mib(w.pid) for w in workers)
        stolen = sum(w.log_path.read_text(errors="replace").count("stole ") for w in workers)
        for worker in workers:
            worker.stop()
        after = _wait_idle(urls)
        # each worker's first request is its probe for token ids (streams/generate/exact_ids.py)
        requests = sum(a["requests"] - b["requests"] for a, b in zip(after, before, strict=True))
        requests -= len(urls)
        return Run(
            client="draftgen cold" if cold else "draftgen",
            servers=len(urls),
            prompts=count,
            wall_s=committed - started,
            with_startup_s=committed - min(spawned, started),
            last_completion_s=last_completion - started,
            publish_s=published - started,
            **sampler.figures(started, committed),
            requests=requests,
            duplicates=requests - count,
            output_tokens=_tokens(after, before),
            cpu_ms_per_prompt=(sum(cpu1) - sum(cpu0)) * 1000 / count,
            broker_cpu_ms_per_prompt=(broker1 - broker0) * 1000 / count,
            peak_rss_mib=rss,
            stolen_lines=stolen,
        )


def _stats(urls: list[str]) -> list[dict[str, Any]]:
    from tests.integration.probes import emulator_stats

    return [emulator_stats(u) for u in urls]


def _wait_idle(urls: list[str]) -> list[dict[str, Any]]:
    """The servers' counters once nothing runs or waits (a duplicate may still be running)."""
    deadline = time.monotonic() + 600
    while True:
        stats = _stats(urls)
        if all(s["running"] == 0 and s["queued"] == 0 for s in stats):
            return stats
        if time.monotonic() > deadline:
            raise RuntimeError("servers still busy after 600 s")
        time.sleep(0.2)


def _tokens(after: list[dict[str, Any]], before: list[dict[str, Any]]) -> int:
    return sum(
        a["completion_tokens"] - b["completion_tokens"] for a, b in zip(after, before, strict=True)
    )


class _Sampler(threading.Thread):
    """Samples the servers' running requests every `interval` s from its start to `stop()`:
    when every slot was first busy, when last, and the mean share of slots busy."""

    def __init__(self, urls: list[str], slots: int, interval: float = 0.05):
        super().__init__(daemon=True)
        self.urls = urls
        self.slots = slots * len(urls)
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                running = sum(s["running"] for s in _stats(self.urls))
            except OSError:
                running = 0
            self.samples.append((time.time(), running))
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def figures(self, start: float, end: float) -> dict[str, float | None]:
        inside = [(t, n) for t, n in self.samples if start <= t <= end]
        full = [t for t, n in inside if n >= self.slots]
        return {
            "all_slots_busy_s": full[0] - start if full else None,
            "last_all_busy_s": full[-1] - start if full else None,
            "busy_share": sum(n for _, n in inside) / (len(inside) * self.slots) if inside else 0.0,
        }


async def _watch_end(kafka: Any, count: int, workers: list[Any]) -> tuple[float, float]:
    """(time the last prompt's first completion landed, time every prompt was committed)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    from streams.core.settings import COMPLETIONS, GENERATE_GROUP, PROMPTS

    admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
    await admin.start()
    ends = AIOKafkaConsumer(**kafka.aiokafka_kwargs(), enable_auto_commit=False)
    await ends.start()
    reader = AIOKafkaConsumer(
        **kafka.aiokafka_kwargs(), **kafka.consumer_kwargs(), enable_auto_commit=False
    )
    await reader.start()
    prompts = [TopicPartition(kafka.topic(PROMPTS), p) for p in range(kafka.partitions)]
    completions = [TopicPartition(kafka.topic(COMPLETIONS), p) for p in range(kafka.partitions)]
    reader.assign(completions)
    await reader.seek_to_beginning(*completions)
    seen: set[bytes] = set()
    last_completion = 0.0

    async def read() -> None:
        nonlocal last_completion
        while len(seen) < count:
            batch = await reader.getmany(timeout_ms=100)
            for records in batch.values():
                for record in records:
                    if record.key not in seen:
                        seen.add(record.key)
                        last_completion = time.time()

    reading = asyncio.create_task(read())
    deadline = time.monotonic() + 1800
    try:
        while True:
            committed = await admin.list_consumer_group_offsets(kafka.group(GENERATE_GROUP))
            end = await ends.end_offsets(prompts)
            lag = sum(o - (committed[tp].offset if tp in committed else 0) for tp, o in end.items())
            if lag == 0 and sum(end.values()) >= count:
                done = time.time()
                await asyncio.wait_for(reading, 60)
                return last_completion, done
            if time.monotonic() > deadline:
                raise RuntimeError("run did not finish in 1800 s")
            for worker in workers:
                if not worker.alive():
                    raise RuntimeError(f"worker exited; see {worker.log_path}")
            await asyncio.sleep(0.1)
    finally:
        reading.cancel()
        await reader.stop()
        await ends.stop()
        await admin.close()


# -- the whole benchmark -----------------------------------------------------------------------


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def summarize(servers: int, runs: list[Run], best_s: float, capacity_s: float) -> dict[str, Any]:
    clients: dict[str, Any] = {}
    for name in ("batch", "draftgen", "draftgen cold"):
        mine = [r for r in runs if r.client == name]
        if not mine:
            continue
        wall = [r.wall_s for r in mine]
        clients[name] = {
            "wall_s": wall,
            "wall_median_s": statistics.median(wall),
            "with_startup_s": [r.with_startup_s for r in mine],
            "with_startup_median_s": statistics.median(r.with_startup_s for r in mine),
            "ratio_to_best": statistics.median(wall) / best_s,
            "ratio_to_best_with_startup": statistics.median(r.with_startup_s for r in mine)
            / best_s,
            "capacity_share": capacity_s / statistics.median(wall),
            "duplicates": [r.duplicates for r in mine],
            "cpu_ms_per_prompt": statistics.median(r.cpu_ms_per_prompt for r in mine),
            "peak_rss_mib": max(r.peak_rss_mib for r in mine),
            "runs": [{k: v for k, v in asdict(r).items() if k != "tokens"} for r in mine],
        }
        completions = [r.last_completion_s for r in mine if r.last_completion_s is not None]
        if completions:
            clients[name]["last_completion_median_s"] = statistics.median(completions)
        for figure in ("publish_s", "all_slots_busy_s", "last_all_busy_s", "busy_share"):
            values = [getattr(r, figure) for r in mine if getattr(r, figure) is not None]
            if values:
                median = f"{figure.removesuffix('_s')}_median" + (
                    "_s" if figure.endswith("_s") else ""
                )
                clients[name][median] = statistics.median(values)
        broker = [r.broker_cpu_ms_per_prompt for r in mine if r.broker_cpu_ms_per_prompt]
        if broker:
            clients[name]["broker_cpu_ms_per_prompt"] = statistics.median(broker)
    return {
        "servers": servers,
        "prompts": runs[0].prompts,
        "best_possible_s": best_s,
        "capacity_s": capacity_s,
        "best_capacity_share": capacity_s / best_s,
        "clients": clients,
    }


def print_summary(summary: dict[str, Any]) -> None:
    s = summary
    print(
        f"\n{s['servers']} server(s), {s['prompts']} prompts: "
        f"best possible {s['best_possible_s']:.1f} s"
        f" (capacity {s['capacity_s']:.1f} s, best = {s['best_capacity_share']:.2f} of capacity)"
    )
    head = (
        f"  {'client':<14} {'wall s: median (min-max)':<26} {'x best':>6} {'of cap':>6} "
        f"{'+start-up s':>18} {'x best':>6} {'dup req':>10} {'CPU-ms/p':>8} {'RSS MiB':>8}"
    )
    print(head)
    for name, c in s["clients"].items():
        print(
            f"  {name:<14} {_spread(c['wall_s']):<26} {c['ratio_to_best']:>6.2f} "
            f"{c['capacity_share']:>6.2f} {_spread(c['with_startup_s']):>18} "
            f"{c['ratio_to_best_with_startup']:>6.2f} {','.join(map(str, c['duplicates'])):>10} "
            f"{c['cpu_ms_per_prompt']:>8.1f} {c['peak_rss_mib']:>8.0f}"
        )
        print(
            f"  {'':<14} every slot busy from {c.get('all_slots_busy_median_s') or 0:.1f} s to "
            f"{c.get('last_all_busy_median_s') or 0:.1f} s; slots busy on average "
            f"{c.get('busy_share_median', 0):.2f}"
        )
        if "last_completion_median_s" in c:
            print(
                f"  {'':<14} last completion in Kafka: "
                f"median {c['last_completion_median_s']:.1f} s; "
                f"publish took {c.get('publish_median_s', 0):.1f} s;"
                f" broker CPU-ms/prompt {c.get('broker_cpu_ms_per_prompt', 0):.1f}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-client", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument("--servers", default="1,4,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts-per-server", type=int, default=128)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--tokens-per-s", type=float, default=150.0)
    parser.add_argument("--min-output", type=int, default=64)
    parser.add_argument("--max-output", type=int, default=2048)
    parser.add_argument("--vocab", choices=("tiny", "qwen"), default="qwen")
    parser.add_argument(
        "--clients",
        default="batch,draftgen,cold",
        help="which clients to run, in this order in odd repeats (reversed in even ones); the "
        "batch client is always run: its output lengths give the best possible",
    )
    parser.add_argument("--no-cold", action="store_true", help="skip the draftgen cold runs")
    parser.add_argument(
        "--worker-arg", action="append", default=[], help="extra flag for the generate workers"
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--quick", action="store_true", help="a smoke test: small and fast")
    args = parser.parse_args()
    if args.batch_client:
        return batch_client_main(args.batch_client)
    if args.quick:
        args.servers, args.repeats, args.prompts_per_server = "2", 1, 12
        args.slots, args.tokens_per_s, args.min_output, args.max_output = 4, 2000.0, 16, 256
        args.vocab = "tiny"
    counts = [int(n) for n in args.servers.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="bench-tail-"))
    bench = Bench(args, workdir)
    summaries = []
    with bench.stack:
        bench.start()
        for servers in counts:
            emulators = bench.emulators(servers)
            urls = [url for url, _ in emulators]
            prompts, count = bench.prompts_file(servers)
            runs: list[Run] = []
            names = {"batch": "batch", "draftgen": "draftgen", "cold": "draftgen cold"}
            clients = [names[c] for c in args.clients.split(",")]
            if args.no_cold and "draftgen cold" in clients:
                clients.remove("draftgen cold")
            if "batch" not in clients:
                clients.insert(0, "batch")
            for repeat in range(args.repeats):
                order = clients if repeat % 2 == 0 else list(reversed(clients))
                for client in order:
                    if client == "batch":
                        run = bench.run_batch(urls, prompts, count)
                    else:
                        run = bench.run_draftgen(urls, prompts, count, cold=client != "draftgen")
                    runs.append(run)
                    print(
                        f"{servers} server(s) #{repeat + 1} {client:<14} {run.wall_s:6.1f} s "
                        f"(with start-up {run.with_startup_s:6.1f} s) requests {run.requests} "
                        f"dup {run.duplicates} tokens {run.output_tokens} "
                        f"cpu {run.cpu_ms_per_prompt:.1f} ms/prompt rss {run.peak_rss_mib:.0f} MiB",
                        flush=True,
                    )
            tokens = next(r.tokens for r in runs if r.client == "batch")
            best = best_possible(tokens, servers, args.slots, args.tokens_per_s)
            capacity = sum(tokens) / (servers * args.slots * args.tokens_per_s)
            summary = summarize(servers, runs, best, capacity)
            summary["output_tokens"] = sum(tokens)
            print_summary(summary)
            summaries.append(summary)
            for _, process in emulators:
                process.stop()
    result = {
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "machine": {"cpus": os.cpu_count(), "uname": " ".join(os.uname())},
        "results": summaries,
        "logs": str(workdir / "logs"),
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    print(f"\nlogs: {workdir / 'logs'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
