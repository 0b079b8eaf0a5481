"""Soak: a few thousand prompts through the real stack while workers are killed and servers
fail at random. Prints the counts that must hold: prompts in = samples + dead letters, and no
prompt_id twice among committed shards.

    .venv/bin/python tests/benchmarks/soak.py [--prompts 3000] [--minutes 15] [--seed 1]

Bounded: it stops after --minutes whatever happens, and stops every process it started.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

import orjson

from compose.stack import LocalStack
from compose.tiny_tokenizers import build_qwen36_tokenizer
from producers.publish import publish
from producers.sources import parse_source_spec
from sinks.shards import ShardStore
from streams.cli.run_wait import RunFailed, wait_until_done
from streams.core.settings import KafkaSettings
from streams.tools.dead_letters import read_dead_letters
from streams.tools.progress import dataset_figures


def write_prompts(path: Path, count: int, rng: random.Random) -> Path:
    with path.open("wb") as handle:
        for index in range(count):
            turns = [{"role": "user", "content": f"[{index}] task {rng.random():.6f}"}]
            handle.write(orjson.dumps({"messages": turns}) + b"\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=3000)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="draftgen-soak-"))
    stack = LocalStack(work)
    deadline = time.monotonic() + args.minutes * 60
    try:
        bootstrap = stack.start_kafka()
        s3 = stack.start_s3()
        s3.create_bucket("soak")
        tokenizer = build_qwen36_tokenizer(work / "tokenizer")
        env = {
            "DRAFTGEN_S3_ENDPOINT_URL": s3.endpoint.endpoint_url,
            "DRAFTGEN_S3_ACCESS_KEY": s3.endpoint.access_key,
            "DRAFTGEN_S3_SECRET_KEY": s3.endpoint.secret_key,
            "DRAFTGEN_KAFKA_SESSION_TIMEOUT_S": "10",
        }
        kafka = KafkaSettings(bootstrap=bootstrap, partitions=16)
        common = ["--bootstrap", bootstrap, "--partitions", "16"]
        faults = (
            "--fail-503-rate",
            "0.05",
            "--fail-500-rate",
            "0.02",
            "--drop-rate",
            "0.02",
            "--fail-400-rate",
            "0.01",
            "--tokens-per-s",
            "1500",
        )
        servers = [
            stack.start_emulator_process(tokenizer, "--seed", str(i), *faults, name=f"emulator-{i}")
            for i in range(args.servers)
        ]
        workers = [
            stack.start_worker(
                f"generate-{i}",
                ["worker", "generate", "--server", url, "--concurrency", "24", *common],
                env=env,
            )
            for i, (url, _) in enumerate(servers)
        ]
        workers.append(
            stack.start_worker(
                "tokenize",
                [
                    "worker",
                    "tokenize",
                    "--tokenizer-dir",
                    str(tokenizer),
                    "--out",
                    "s3://soak/out",
                    "--dataset",
                    "soak",
                    "--idle-flush",
                    "2",
                    *common,
                ],
                env=env,
            )
        )
        source = write_prompts(work / "prompts.jsonl", args.prompts, rng)
        summary = asyncio.run(publish(kafka, [parse_source_spec(str(source))], progress=False))
        expected = set(summary.prompt_ids)
        store = ShardStore("s3://soak/out", "soak", s3.endpoint.storage_options())
        kills = 0
        while time.monotonic() < deadline:
            try:
                asyncio.run(
                    wait_until_done(kafka, store, expected, [], timeout_s=20, show_progress=False)
                )
                break
            except RunFailed:
                pass
            victim = rng.choice(workers)
            victim.kill()
            kills += 1
            time.sleep(rng.uniform(0, 3))
            workers[workers.index(victim)] = stack.restart(victim)
            if rng.random() < 0.3:
                _, server = rng.choice(servers)
                server.kill()
                time.sleep(rng.uniform(2, 8))
                servers = [(u, stack.restart(p) if p is server else p) for u, p in servers]
        figures = dataset_figures(store)
        letters = asyncio.run(read_dead_letters(kafka))
        dead = {letter.prompt_id for letter in letters if letter.prompt_id} - figures.prompt_ids
        print(f"prompts in          {len(expected)}")
        print(f"samples             {figures.samples}")
        print(f"dead letters        {len(dead)}")
        print(f"duplicate ids       {figures.duplicate_ids}")
        print(f"unaccounted         {len(expected - figures.prompt_ids - dead)}")
        print(f"worker kills        {kills}")
        ok = figures.duplicate_ids == 0 and figures.samples + len(dead) == len(expected)
        print("OK" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        stack.stop_all()


if __name__ == "__main__":
    sys.exit(main())
