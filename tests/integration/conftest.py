"""What an integration test builds on. The Kafka broker and SeaweedFS are the session's
(tests/conftest.py: one pair per xdist worker, started when its first test needs them, shared
by every integration file that worker runs). A test takes `pipeline`: its own topic prefix, so
its own topics and consumer groups, and its own S3 prefix on that pair; it starts what it needs
through `pipeline.emulator/generate/tokenize/replay` (stopped by PID when it ends) and reads the
outcome with `pipeline.wait/assert_exactly_once`. A test that stops the shared broker or S3
restarts it before it ends (test_faults.py); one that needs several brokers starts its own
(test_cluster.py, module-scoped). Also here: prompt sets (`write_prompts`) and the tiny
tokenizer, built once per session."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from compose.process import ManagedProcess
from compose.seaweedfs import SeaweedS3
from compose.stack import LocalStack, draftgen_argv
from compose.tiny_tokenizers import build_qwen36_tokenizer
from producers.publish import PublishSummary, publish
from producers.sources import parse_source_spec
from sinks.reader import DatasetReader
from sinks.shards import ShardStore
from streams.cli.run_wait import RunResult, wait_until_done
from streams.core.records import CompletionRecord, DeadLetter
from streams.core.settings import COMPLETIONS, KafkaSettings
from streams.tools.dead_letters import read_dead_letters
from streams.tools.progress import dataset_figures
from tests.faults import LAUNCHER, Crash

WORDS = [
    "refactor",
    "the",
    "parser",
    "so",
    "that",
    "errors",
    "carry",
    "line",
    "numbers;",
    "explain",
    "the",
    "trade-offs",
    "write",
    "a",
    "python",
    "function",
    "that",
    "merges",
    "overlapping",
    "intervals",
    "and",
    "test",
    "it",
    "summarize",
    "the",
    "design",
    "of",
    "a",
    "write-ahead",
    "log",
    "for",
    "a",
    "key",
    "value",
    "store",
    "why",
    "does",
    "my",
    "rust",
    "borrow",
    "checker",
    "complain",
    "about",
    "this",
    "closure",
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command in the repository",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))).capitalize() + "?"


def make_conversation(index: int, rng: random.Random) -> dict[str, Any]:
    """Multi-turn, with and without system prompts, some with tools and tool results."""
    messages: list[dict[str, Any]] = []
    if index % 3 == 0:
        messages.append({"role": "system", "content": f"You are assistant #{index}."})
    for _ in range(index % 3):
        messages.append({"role": "user", "content": _sentence(rng)})
        messages.append({"role": "assistant", "content": _sentence(rng)})
    messages.append({"role": "user", "content": f"[{index}] {_sentence(rng)}"})
    row: dict[str, Any] = {"messages": messages}
    if index % 5 == 0:
        row["tools"] = TOOLS
        call_id = f"call_{index}"
        messages += [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "run_shell", "arguments": '{"command": "ls"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": "README.md\nsrc\n"},
        ]
    return row


@pytest.fixture
def write_prompts(tmp_path: Path) -> Callable[..., Path]:
    def write(count: int, name: str = "prompts.jsonl", start: int = 0, seed: int = 7) -> Path:
        rng = random.Random(seed)
        path = tmp_path / name
        with path.open("wb") as handle:
            for index in range(start, start + count):
                handle.write(orjson.dumps(make_conversation(index, rng)) + b"\n")
        return path

    return write


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen36_tokenizer(tmp_path_factory.mktemp("tok") / "qwen36-tiny")


class Pipeline:
    """One test's pipeline on the session's Kafka and S3: its own topics, groups and prefix."""

    def __init__(
        self,
        stack: LocalStack,
        bootstrap: str,
        s3: SeaweedS3,
        env: dict[str, str],
        prefix: str,
        tokenizer_dir: Path,
        partitions: int = 8,
        dataset: str = "ds",
    ):
        self.stack = stack
        self.bootstrap = bootstrap
        self.s3 = s3
        self.env = env
        self.prefix = prefix
        self.tokenizer_dir = tokenizer_dir
        self.partitions = partitions
        self.dataset = dataset
        self.out = f"s3://draftgen-test/{prefix}out"

    @property
    def kafka(self) -> KafkaSettings:
        return KafkaSettings(
            bootstrap=self.bootstrap, topic_prefix=self.prefix, partitions=self.partitions
        )

    @property
    def common(self) -> list[str]:
        return [
            "--bootstrap",
            self.bootstrap,
            "--topic-prefix",
            self.prefix,
            "--partitions",
            str(self.partitions),
        ]

    def draftgen(
        self, *args: str, timeout: float = 120, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`draftgen ARGS` on this pipeline's environment, its output captured as text."""
        return subprocess.run(
            draftgen_argv(*args),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
        )

    def store(self, dataset: str | None = None) -> ShardStore:
        return ShardStore(self.out, dataset or self.dataset, self.s3.endpoint.storage_options())

    def emulator(
        self, *options: str, name: str = "emulator", tokenizer_dir: Path | None = None
    ) -> tuple[str, ManagedProcess]:
        return self.stack.start_emulator_process(
            tokenizer_dir or self.tokenizer_dir, "--tokens-per-s", "4000", *options, name=name
        )

    def generate(
        self,
        server: str,
        *extra: str,
        name: str = "generate",
        env: dict[str, str] | None = None,
        log_level: str = "INFO",
    ) -> ManagedProcess:
        return self.stack.start_worker(
            name,
            [
                "--log-level",
                log_level,
                "worker",
                "generate",
                "--server",
                server,
                "--concurrency",
                "16",
                *self.common,
                *extra,
            ],
            env={**self.env, **(env or {})},
        )

    def tokenize(
        self,
        *extra: str,
        dataset: str | None = None,
        name: str = "tokenize",
        env: dict[str, str] | None = None,
        crash: Crash | None = None,
    ) -> ManagedProcess:
        """A tokenize worker; with `crash`, one that ends itself at that crash point."""
        if crash is not None:
            env = {**(env or {}), **crash.env()}
        return self.stack.start_worker(
            name,
            [
                "--log-level",
                "INFO",
                "worker",
                "tokenize",
                "--tokenizer-dir",
                str(self.tokenizer_dir),
                "--out",
                self.out,
                "--dataset",
                dataset or self.dataset,
                "--idle-flush",
                "1",
                "--shard-records",
                "50",
                *self.common,
                *extra,
            ],
            env={**self.env, **(env or {})},
            module=LAUNCHER if crash is not None else "streams",
        )

    def replay(self, dataset: str, *extra: str, name: str = "replay") -> ManagedProcess:
        """`draftgen replay --follow` of the completions topic into the version `dataset`: a
        worker that keeps following, as the tests' other workers do."""
        return self.stack.start_worker(
            name,
            [
                "--log-level",
                "INFO",
                "replay",
                "--tokenizer-dir",
                str(self.tokenizer_dir),
                "--out",
                self.out,
                "--dataset",
                dataset,
                "--idle-flush",
                "1",
                "--follow",
                *extra,
                *self.common,
            ],
            env=self.env,
        )

    def publish(self, source: Path) -> PublishSummary:
        return asyncio.run(publish(self.kafka, [parse_source_spec(str(source))], progress=False))

    def wait(
        self,
        expected: set[str],
        workers: list[ManagedProcess],
        timeout: float = 240,
        dataset: str | None = None,
    ) -> RunResult:
        return asyncio.run(
            wait_until_done(
                self.kafka, self.store(dataset), expected, workers, timeout, show_progress=False
            )
        )

    def completions(self) -> dict[str, CompletionRecord]:
        return asyncio.run(_read_topic(self.kafka, COMPLETIONS, CompletionRecord))

    def dead_letters(self) -> list[DeadLetter]:
        return asyncio.run(read_dead_letters(self.kafka))

    def assert_exactly_once(self, expected: set[str], dataset: str | None = None) -> None:
        """Each expected prompt id has one outcome: a committed sample or a recorded drop of this
        version, or a dead letter of an earlier stage; nothing else; and the resolved shards
        hold each sample once, with the rows the markers promise."""
        store = self.store(dataset)
        figures = dataset_figures(store)
        dead = {letter.prompt_id for letter in self.dead_letters() if letter.prompt_id}
        assert figures.prompt_ids | dead == expected
        table = DatasetReader(store).table()
        assert table.num_rows == figures.samples
        assert len(set(table["prompt_id"].to_pylist())) == table.num_rows


async def _read_topic(kafka: KafkaSettings, topic: str, record_type: Any) -> dict[str, Any]:
    """Every record of a topic up to its current end, keyed by prompt id (last one wins)."""
    consumer = AIOKafkaConsumer(**kafka.aiokafka_kwargs(), enable_auto_commit=False)
    await consumer.start()
    found: dict[str, Any] = {}
    try:
        name = kafka.topic(topic)
        partitions = [TopicPartition(name, p) for p in (await _partitions(consumer, name))]
        consumer.assign(partitions)
        await consumer.seek_to_beginning()
        ends = await consumer.end_offsets(partitions)
        for tp, end in ends.items():
            while await consumer.position(tp) < end:
                batch = await consumer.getmany(tp, timeout_ms=1000)
                for record in batch.get(tp, []):
                    decoded = record_type.decode(record.value)
                    found[decoded.prompt_id] = decoded
    finally:
        await consumer.stop()
    return found


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    # `consumer.topics()` reads metadata into a copy: partitions_for_topic would stay None
    await consumer._client.force_metadata_update()
    return consumer.partitions_for_topic(topic) or set()


@pytest.fixture
def pipeline(
    stack: LocalStack,
    bootstrap: str,
    s3: SeaweedS3,
    s3_env: dict[str, str],
    topic_prefix: str,
    qwen_tokenizer_dir: Path,
) -> Pipeline:
    return Pipeline(stack, bootstrap, s3, s3_env, topic_prefix, qwen_tokenizer_dir)
