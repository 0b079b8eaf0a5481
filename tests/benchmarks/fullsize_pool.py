"""The full-size benchmark's completions: a pool of records with the seed run's length
distribution (a lognormal body and a long tail), planned into a run and produced in parallel
(tests/benchmarks/bench_fullsize.py)."""

from __future__ import annotations

import asyncio
import glob
import json
import math
import os
import pickle
import random
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np

SEED_SAMPLES = 902_087
SEED_TOKENS = 1_870_000_000
MIN_LEN, MAX_LEN = 64, 131_072
SIGMA = 1.1  # of log length: ~0.1% of samples above 32K tokens, ~1e-5 above 120K
MU = math.log(SEED_TOKENS / SEED_SAMPLES) - SIGMA**2 / 2  # so the mean is the seed's
TAIL = (40_000, 64_000, 96_000, 112_000, 126_000)  # pool entries beyond the body's quantiles
PLACEHOLDER = b"@@prompt-id@@000"  # 16 bytes, replaced by each record's own prompt id
SOURCES = {"instruct": "general-instruction", "code": "code", "chat": "general-instruction"}


def prompt_id(index: int) -> bytes:
    return f"fs{index:014d}".encode()  # as long as PLACEHOLDER


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


def make_pool_files(tokenizer: Path, root: Path, size: int, seed: int) -> None:
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


def produce_share(kafka_json: str, pool_path: str, plan_path: str, share: int, of: int) -> None:
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
