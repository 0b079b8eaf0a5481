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
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.proc import cpu_s, peak_rss_mib
from tests.benchmarks.tail_batch_client import batch_client_main
from tests.benchmarks.tail_summary import Run, print_summary, summarize
from tests.benchmarks.tail_watch import (
    WorkerSampler,
    server_stats,
    tokens_between,
    wait_idle,
    watch_end,
)

READY_LINE = "generating with model"


# -- best possible -----------------------------------------------------------------------------


def best_possible(tokens: Sequence[float], servers: int, slots: int, tokens_per_s: float) -> float:
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


# -- one run -----------------------------------------------------------------------------------


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
        before = server_stats(urls)
        sampler = WorkerSampler(urls, self.args.slots)
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
        after = wait_idle(urls)
        requests = sum(a["requests"] - b["requests"] for a, b in zip(after, before, strict=True))
        return Run(
            client="batch",
            servers=len(urls),
            prompts=count,
            wall_s=result["ended"] - result["started"],
            with_startup_s=result["ended"] - spawned,
            requests=requests,
            duplicates=requests - count,
            output_tokens=tokens_between(after, before),
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
        before = server_stats(urls)
        asyncio.run(ensure_topics(kafka))
        workers: list[Any] = []
        spawned = time.time()
        if not cold:
            workers = self._start_workers(urls, kafka)
            self._wait_joined(workers, kafka)
        broker = self.broker_pid()
        broker0 = cpu_s(broker) if broker else 0.0
        cpu0 = [cpu_s(w.pid) for w in workers]
        sampler = WorkerSampler(urls, self.args.slots)
        sampler.start()
        started = time.time()
        spec = parse_source_spec(str(prompts))
        asyncio.run(publish(kafka, [spec], progress=False))
        published = time.time()
        if cold:
            spawned = time.time()
            workers = self._start_workers(urls, kafka)
            cpu0 = [0.0] * len(workers)
        last_completion, committed = asyncio.run(watch_end(kafka, count, workers))
        sampler.stop()
        cpu1 = [cpu_s(w.pid) for w in workers]
        broker1 = cpu_s(broker) if broker else 0.0
        rss = max(peak_rss_mib(w.pid) for w in workers)
        stolen = sum(w.log_path.read_text(errors="replace").count("stole ") for w in workers)
        for worker in workers:
            worker.stop()
        after = wait_idle(urls)
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
            output_tokens=tokens_between(after, before),
            cpu_ms_per_prompt=(sum(cpu1) - sum(cpu0)) * 1000 / count,
            broker_cpu_ms_per_prompt=(broker1 - broker0) * 1000 / count,
            peak_rss_mib=rss,
            stolen_lines=stolen,
        )


# -- the whole benchmark -----------------------------------------------------------------------


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
