"""What cleaning costs publish, per 100K prompts (producers/clean.py): time and memory of the
text dedup and of decontamination against evaluation sets, beside the cost of making the prompt
records that publish pays anyway.

    .venv/bin/python tests/benchmarks/bench_clean.py [--prompts 100000] [--eval-tasks 2000]

Prompts are made from the emulator's filler text (textgen.prose: words, numbers, a little
non-ASCII), ~150 words each, one user message; 10% are copies of an earlier prompt with its
whitespace changed, 5% copies with a sentence added (near duplicates). The evaluation set is
`--eval-tasks` rows of the same kind of text, ~60 words in two fields (a HumanEval-sized set
is 164 tasks; MBPP's test split 500; GSM8K's 1,319).
Memory: what each cleaner keeps after all the prompts (tracemalloc), a prompt's share of it.
"""

from __future__ import annotations

import argparse
import random
import resource
import time
import tracemalloc

from compose.emulator import textgen
from producers.clean import EvalNgrams, NearDuplicates, PromptCleaner
from streams.core.normalize import make_prompt_record


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def texts(count: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [textgen.prose(rng, words, lambda t: len(t.split()), False) for _ in range(count)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--eval-tasks", type=int, default=2000)
    args = parser.parse_args(argv)
    rng = random.Random(0)
    base = texts(args.prompts, 150, 1)
    for i in range(0, len(base), 10):  # a whitespace variant of an earlier prompt
        j = rng.randrange(max(1, i))
        base[i] = base[j].replace(" ", "  ", 3) + "\n"
    for i in range(5, len(base), 20):  # an earlier prompt with a sentence added
        j = rng.randrange(i)
        base[i] = base[j] + " Answer briefly and cite your sources."
    rows = [{"messages": [{"role": "user", "content": t}]} for t in base]

    rss = peak_rss_mb()
    started = time.perf_counter()
    records = [make_prompt_record(row, "bench.jsonl", {}) for row in rows]
    make_s = time.perf_counter() - started

    evals = EvalNgrams()
    started = time.perf_counter()
    evals.add("eval", ({"q": t, "a": t[::-1]} for t in texts(args.eval_tasks, 30, 2)))
    load_s = time.perf_counter() - started
    rss_records = peak_rss_mb()

    results = {}
    for name, make in (
        ("dedup only", lambda: PromptCleaner(dedup_text=True)),
        ("dedup + decontamination", lambda: PromptCleaner(dedup_text=True, evals=evals)),
        ("dedup + near dups 0.8", lambda: PromptCleaner(near=NearDuplicates(0.8))),
    ):
        cleaner = make()
        started = time.perf_counter()
        removed = sum(cleaner.check(record) is not None for record in records)
        seconds = time.perf_counter() - started
        # what the cleaner keeps, measured in a second pass (tracing slows it)
        tracemalloc.start()
        cleaner = make()
        for record in records:
            cleaner.check(record)
        kept = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        results[name] = (seconds, removed, kept / len(records))
    per = 100_000 / args.prompts
    print(f"{args.prompts:,} prompts of ~150 words; evaluation set: {args.eval_tasks:,} rows, "
          f"{len(evals.grams):,} 13-grams, read in {load_s:.2f} s")  # fmt: skip
    print(f"making the prompt records (publish's own work): {make_s * per:.1f} s per 100K")
    print(f"records and evaluation n-grams in memory: +{rss_records - rss:.0f} MB peak RSS")
    for name, (seconds, removed, kept) in results.items():
        print(
            f"{name:24} {seconds * per:5.1f} s per 100K ({seconds / make_s:.1f}x making the "
            f"records), removed {removed:,}, keeps {kept:.0f} bytes a prompt"
        )


if __name__ == "__main__":
    main()
