"""Saturation on a long run (issue 32): do the generate workers keep every slot of every server
busy, over at least `--minutes` of generation at 1, 4 and 8 emulated SGLang servers?

    flock /tmp/draftgen-heavy.lock .venv/bin/python tests/benchmarks/bench_saturation.py \\
        [--sizes 1,4,8] [--minutes 10] [--tokens-per-s 45] [--slots 32] [--json PATH]

Not in CI (a full run is over half an hour). Starts its own Kafka broker (no S3, no tokenize
stage: this measures the generate stage) and, per size S, S emulated SGLang servers of `--slots`
running requests (`--max-running-requests`), each request decoding at `--tokens-per-s` (Kimi
K2.6 decodes ~30-60 tokens/s per request on a loaded server: 45 by default), with one
generate worker per server (`--concurrency auto`, static membership), joined and idle before
the prompts are published; the clock starts at the publish.

Outputs are long thinking answers of log-normal length around `--mean-output` tokens (sigma
0.6), cut at `--max-output` (the workers' `--max-tokens`): a pool of `--pool` outputs made once
by the emulator's own generator (bench_run_scaling's `_output_pool`) and served as a script, so
the emulators spend no CPU writing text (a GPU's work, not this machine's) and every prompt's
output length is known before the run. Prompt i gets pool entry i mod `--pool`. Per size,
enough prompts that the ideal schedule lasts at least `--minutes`.

Slot occupancy is measured from the emulators' request logs (`--request-log`: each request's
start and end): the slot-seconds of the answers kept (a prompt's first whole answer; duplicates
and failures count as waste, shown apart) over the fleet's slots x the time.
- whole run: from the publish to the end of the last answer;
- steady state: from the first moment every slot of the fleet is busy to the moment the last
  prompt's first request starts (from then on nothing is left to start and slots drain, as in
  any schedule); a perfect pipeline keeps every slot busy throughout it (1.0).
The best possible is list scheduling in arrival order (the prompts file's order) onto the
earliest free slot from the publish, with each prompt's tokens / rate (bench_tail's
`best_possible`): its occupancy over the whole run is the sum of the durations over slots x its
makespan. Targets: >= 0.95 steady, >= 0.9 x the best over the whole run.

CPU: of each process (the workers, the emulators, the broker, this benchmark; /proc/PID/stat)
from the publish to the last commit, and of the whole machine (/proc/stat: other work on a
shared machine shows as the rest); the workers' and the broker's idle CPU (joined, no prompts)
over `--idle-s` before the publish. `--profile-s` > 0 records one generate worker with py-spy
(`pip install py-spy` into the venv; skipped if absent) for that long from `--profile-at` s
after the publish, and summarises where its busy samples are.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from compose.emulator.request_log import prompt_digest
from tests.benchmarks.bench_run_scaling import _output_pool, _prompt_text
from tests.benchmarks.bench_tail import Bench, best_possible
from tests.benchmarks.proc import cpu_s, peak_rss_mib
from tests.benchmarks.saturation_analysis import (
    machine_busy_s,
    occupancy,
    read_requests,
    summarize_profile,
)
from tests.benchmarks.tail_watch import WorkerSampler, wait_idle, watch_end


class Saturation(Bench):
    """bench_tail's broker, tokenizer and workers; emulators serving the output pool."""

    def __init__(self, args: argparse.Namespace, workdir: Path):
        super().__init__(args, workdir)
        self.script = workdir / "pool.jsonl"
        self.pool_tokens: list[int] = []

    def start(self) -> None:
        super().start()
        a = self.args
        started = time.monotonic()
        _output_pool(self.script, self.tokenizer, a.pool, a.mean_output)
        self.pool_tokens = self._pool_lengths()
        mean = sum(self.pool_tokens) / len(self.pool_tokens)
        print(
            f"output pool: {a.pool} outputs, mean {mean:.0f} tokens, "
            f"{min(self.pool_tokens)}-{max(self.pool_tokens)} "
            f"(made in {time.monotonic() - started:.0f} s)",
            flush=True,
        )

    def _pool_lengths(self) -> list[int]:
        """Each pool output's length as the emulator serves it: the script text encoded, its
        end-of-turn token, cut at the request's max_tokens (compose/emulator/generation.py)."""
        from compose.emulator.model import EmulatedModel

        model = EmulatedModel(self.tokenizer)
        eot = 1 if model.special.eot is not None else 0
        lengths = []
        for line in self.script.read_bytes().splitlines():
            text = orjson.loads(line)["output"]
            lengths.append(min(len(model.encode(text)) + eot, self.args.max_output))
        return lengths

    def emulators(self, count: int) -> list[tuple[str, Any]]:
        a = self.args
        return [
            self.stack.start_emulator_process(
                self.tokenizer,
                *("--tokens-per-s", str(a.tokens_per_s)),
                *("--max-running-requests", str(a.slots)),
                *("--script", str(self.script)),
                *("--request-log", str(self.request_log(count, i))),
                name=f"emu{count}-{i}",
            )
            for i in range(count)
        ]

    def request_log(self, servers: int, index: int) -> Path:
        return self.workdir / f"requests-{servers}-{index}.jsonl"

    def prompts(self, servers: int) -> tuple[Path, list[int], dict[str, int]]:
        """The prompts file of a size: enough prompts that the ideal schedule lasts
        `--minutes`; their output lengths and their request-log digests."""
        a = self.args
        pool = self.pool_tokens
        target_s = a.minutes * 60
        rate = servers * a.slots * a.tokens_per_s
        count = math.ceil(target_s * rate / (sum(pool) / len(pool)))

        def lengths(n: int) -> list[int]:
            return [pool[i % len(pool)] for i in range(n)]

        while best_possible(lengths(count), servers, a.slots, a.tokens_per_s) < target_s:
            count += max(1, count // 50)
        path = self.workdir / f"prompts-{servers}.jsonl"
        digests = {}
        with path.open("wb") as handle:
            for index in range(count):
                messages = [{"role": "user", "content": _prompt_text(index, a.pool)}]
                digests[prompt_digest(messages)] = index
                handle.write(orjson.dumps({"messages": messages}) + b"\n")
        return path, lengths(count), digests

    def run_size(self, servers: int) -> dict[str, Any]:
        from producers.publish import publish
        from producers.sources import parse_source_spec
        from streams.core.topics import ensure_topics

        a = self.args
        emulators = self.emulators(servers)
        urls = [url for url, _ in emulators]
        prompts, tokens, digests = self.prompts(servers)
        count = len(tokens)
        ideal_s = best_possible(tokens, servers, a.slots, a.tokens_per_s)
        print(
            f"\n{servers} server(s): {count} prompts, {sum(tokens):,} output tokens, "
            f"ideal {ideal_s / 60:.1f} min",
            flush=True,
        )
        kafka = self._kafka()
        asyncio.run(ensure_topics(kafka))
        workers = self._start_workers(urls, kafka)
        self._wait_joined(workers, kafka)
        pids = {
            "workers": [w.pid for w in workers],
            "emulators": [p.pid for _, p in emulators],
            "broker": [self.broker_pid()],
            "benchmark": [os.getpid()],
        }

        def cpu() -> dict[str, float]:
            return {k: sum(cpu_s(p) for p in v if p) for k, v in pids.items()}

        time.sleep(10)  # the broker settles after the topics' creation and the join
        idle0, idle_at = cpu(), time.monotonic()
        time.sleep(a.idle_s)
        idle1, idle_span = cpu(), time.monotonic() - idle_at
        sampler = WorkerSampler(urls, a.slots, interval=1.0)
        sampler.start()
        cpu0, machine0 = cpu(), machine_busy_s()
        t0 = time.time()
        asyncio.run(publish(kafka, [parse_source_spec(str(prompts))], progress=False))
        published = time.time()
        profile = self._profile(workers[0].pid, servers)
        timeout = max(1800.0, 3 * ideal_s)
        last_completion, committed = asyncio.run(watch_end(kafka, count, workers, timeout))
        cpu1, machine1 = cpu(), machine_busy_s()
        sampler.stop()
        rss = max(peak_rss_mib(w.pid) for w in workers)
        if profile is not None:
            profile.join()
        for worker in workers:
            worker.stop()
        stats = wait_idle(urls)
        for _, process in emulators:
            process.stop()

        requests, probes = read_requests(
            [self.request_log(servers, i) for i in range(servers)], digests
        )
        occ = occupancy(requests, tokens, a.tokens_per_s, servers, a.slots, t0)
        span = committed - t0
        used = {k: cpu1[k] - cpu0[k] for k in cpu1}
        result: dict[str, Any] = {
            "servers": servers,
            "slots": servers * a.slots,
            "prompts": count,
            "output_tokens": sum(tokens),
            "published_at": t0,  # the clock's zero (epoch s), for the request logs
            "publish_s": published - t0,
            "last_completion_s": last_completion - t0,
            "committed_s": span,
            "occupancy": occ.as_dict(),
            "stats_busy_share": sampler.figures(t0, t0 + occ.wall_s)["busy_share"],
            "probe_requests": probes,
            "server_requests": sum(s["requests"] for s in stats),
            "cpu_s": used,
            "cpu_ms_per_prompt": {k: 1000 * v / count for k, v in used.items()},
            "cores": {k: v / span for k, v in used.items()},
            "machine_cores": (machine1 - machine0) / span,
            "idle_cores": {
                k: (idle1[k] - idle0[k]) / idle_span for k in ("workers", "broker", "emulators")
            },
            "worker_peak_rss_mib": rss,
        }
        result["other_cores"] = result["machine_cores"] - sum(result["cores"].values())
        # beyond what the process spends idle (heartbeats, fetch polls, commit ticks)
        result["marginal_cpu_ms_per_prompt"] = {
            k: 1000 * (used[k] - result["idle_cores"][k] * span) / count
            for k in result["idle_cores"]
        }
        if profile is not None and profile.raw.exists():
            result["profile"] = {
                "worker": 0,
                "from_s": a.profile_at,
                "seconds": a.profile_s,
                **summarize_profile(profile.raw),
            }
        print_size(result, a)
        return result

    def _profile(self, pid: int, servers: int) -> Profiler | None:
        a = self.args
        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which(
            "py-spy"
        )
        if a.profile_s <= 0:
            return None
        if spy is None:
            print("  no py-spy (pip install py-spy into the venv): no profile", flush=True)
            return None
        raw = self.workdir / f"profile-{servers}.txt"
        profiler = Profiler(spy, pid, raw, a.profile_at, a.profile_s)
        profiler.start()
        return profiler


class Profiler(threading.Thread):
    """py-spy on one process, from `delay` s on for `seconds`, collapsed stacks to `raw`."""

    def __init__(self, spy: str, pid: int, raw: Path, delay: float, seconds: float):
        super().__init__(daemon=True)
        self.argv = [
            spy, "record", "--pid", str(pid), "--duration", str(int(seconds)),
            "--rate", "100", "--nonblocking", "--format", "raw", "--output", str(raw),
        ]  # fmt: skip
        self.raw = raw
        self.delay = delay

    def run(self) -> None:
        time.sleep(self.delay)
        subprocess.run(self.argv, capture_output=True, check=False, timeout=3600)


def print_size(r: dict[str, Any], a: argparse.Namespace) -> None:
    o = r["occupancy"]
    steady = "n/a (never every slot busy)" if o["steady"] is None else f"{o['steady']:.3f}"
    print(
        f"  occupancy: steady {steady} (with waste {o['steady_busy'] or 0:.3f}; "
        f"{o['steady_from_s'] or 0:.0f}-{o['steady_to_s']:.0f} s); whole run {o['whole']:.3f} "
        f"in {o['wall_s']:.0f} s against the best {o['whole_ideal']:.3f} in {o['ideal_s']:.0f} s "
        f"= {o['whole_vs_ideal']:.3f} of the best; /stats mean running "
        f"{r['stats_busy_share']:.3f}",
        flush=True,
    )
    print(
        f"  extra requests {o['extra_requests']}, wasted {o['wasted_slot_s']:.0f} slot-s; "
        f"requests took {o['stretch']:.4f}x tokens/rate (best of tokens/rate: "
        f"{o['ideal_tokens_s']:.0f} s); committed at {r['committed_s']:.0f} s "
        f"(publish {r['publish_s']:.1f} s)",
        flush=True,
    )
    if o["steady_by_server"]:
        refill = o["refill_ms"] or (0.0, 0.0)
        print(
            "  steady by server: "
            + " ".join(f"{share:.3f}" for share in o["steady_by_server"])
            + "; each server's last start (s): "
            + " ".join(f"{t:.0f}" for t in o["last_start_by_server"])
            + f"; a freed slot refilled in {refill[0]:.0f} ms (median), {refill[1]:.0f} ms (p90)",
            flush=True,
        )
    per, marginal, cores = r["cpu_ms_per_prompt"], r["marginal_cpu_ms_per_prompt"], r["cores"]
    print(
        "  CPU-ms/prompt: "
        + ", ".join(f"{k} {per[k]:.1f}" for k in per)
        + "; beyond idle: "
        + ", ".join(f"{k} {marginal[k]:.1f}" for k in marginal)
        + "\n  cores: "
        + ", ".join(f"{k} {cores[k]:.3f}" for k in cores)
        + f"; machine {r['machine_cores']:.2f} (other processes {r['other_cores']:.2f}); idle: "
        + ", ".join(f"{k} {v:.3f}" for k, v in r["idle_cores"].items()),
        flush=True,
    )
    profile = r.get("profile")
    if profile:
        # the shares of the samples outside the loop's wait, applied to a worker's CPU
        worker_ms = per["workers"] * (1 - profile["event_loop_share"])
        print(
            f"  profile of worker 0: {profile['samples']} samples, "
            f"{profile['event_loop_share']:.0%} in the event loop itself (epoll wait); of the "
            f"rest (~{worker_ms:.1f} CPU-ms/prompt):",
            flush=True,
        )
        for name, share in profile["by_owner"][:10]:
            print(f"    {share:6.1%} ~{share * worker_ms:5.2f} ms  {name}", flush=True)
        print("    draftgen functions, inclusive:", flush=True)
        for name, share in profile["draftgen_inclusive"][:8]:
            print(f"    {share:6.1%}  {name}", flush=True)


def limits(results: list[dict[str, Any]]) -> list[str]:
    """Where on this machine CPU, not the design, would stop adding servers: the cores the
    workers and the broker used over the run, less the broker's idle, per server, into the
    cores there are (less the broker's idle); the emulators' share shown apart."""
    cores = os.cpu_count() or 1
    lines = []
    for r in results:
        servers, used, idle = r["servers"], r["cores"], r["idle_cores"]
        per_server = (used["workers"] + used["broker"] - idle["broker"]) / servers
        emulators = used["emulators"] / servers
        free = cores - idle["broker"]
        if per_server <= 0:
            lines.append(f"{servers} server(s): the broker's idle was above its run: no estimate")
            continue
        lines.append(
            f"{servers} server(s): workers and broker {per_server:.3f} cores a server "
            f"(workers {used['workers'] / servers:.3f}, of it idle "
            f"{idle['workers'] / servers:.3f}), broker idle {idle['broker']:.3f}, emulators "
            f"{emulators:.3f} a server: {cores} cores would drive ~{free / per_server:.0f} "
            f"servers at this rate (~{free / (per_server + emulators):.0f} with the emulators "
            "on the same cores)"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,8", help="emulated servers per run")
    parser.add_argument("--minutes", type=float, default=10.0, help="ideal generation per size")
    parser.add_argument("--tokens-per-s", type=float, default=45.0, help="decode rate a request")
    parser.add_argument("--slots", type=int, default=32, help="max running requests a server")
    parser.add_argument("--mean-output", type=int, default=1500, help="log-normal mean tokens")
    parser.add_argument("--max-output", type=int, default=8192, help="the workers' --max-tokens")
    parser.add_argument("--pool", type=int, default=512, help="distinct outputs (<= 1024)")
    parser.add_argument("--vocab", choices=("tiny", "qwen"), default="qwen")
    parser.add_argument("--idle-s", type=float, default=30.0, help="idle CPU measured this long")
    parser.add_argument("--profile-s", type=float, default=60.0, help="py-spy this long (0: no)")
    parser.add_argument("--profile-at", type=float, default=60.0, help="s after the publish")
    parser.add_argument(
        "--worker-arg", action="append", default=[], help="extra flag for the generate workers"
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    try:
        sizes = [int(n) for n in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: use server counts like 1,4,8")
    if not 1 <= args.pool <= 1024:  # the emulator keeps 1024 decoded outputs (model.py)
        parser.error("--pool: use 1 to 1024")
    args.worker_arg = ["--max-tokens", str(args.max_output), *args.worker_arg]
    workdir = Path(tempfile.mkdtemp(prefix="bench-saturation-"))
    print(
        f"saturation: sizes {sizes}, >= {args.minutes:g} min each, {args.slots} slots at "
        f"{args.tokens_per_s:g} tokens/s a request; work in {workdir}",
        flush=True,
    )
    bench = Saturation(args, workdir)
    results = []
    with bench.stack:
        bench.start()
        for servers in sizes:
            results.append(bench.run_size(servers))
    print()
    for line in limits(results):
        print(line)
    if args.json:
        settings = {k: str(v) for k, v in vars(args).items()}
        machine = {"cpus": os.cpu_count(), "uname": " ".join(os.uname())}
        document = {"settings": settings, "machine": machine, "results": results}
        args.json.write_text(json.dumps(document, indent=2))
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
