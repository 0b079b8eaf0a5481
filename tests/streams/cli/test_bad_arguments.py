"""Every bad flag and `DRAFTGEN_*` setting is one line on stderr naming it, exit status 2, and
nothing waits on it. None needs Kafka: a command that got as far as connecting would fail on
the unused port it is given instead.

Each case calls the command line's `main` in this process (its stderr and exit status, in a
directory of its own, with a clean environment); a few run as real `draftgen` processes with a
deadline too (a module fixture runs them together), to prove the entry point itself prints the
one line and no traceback.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from streams.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
TOKENIZER = str(ROOT / "compose" / "assets" / "qwen36-tiny")
DEADLINE_S = 30
BOOTSTRAP = "BOOTSTRAP"  # replaced by an unused loopback port


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    names: str  # what the line must name: the flag or the environment variable
    env: dict[str, str] = field(default_factory=dict)


def generate(*flags: str) -> tuple[str, ...]:
    return (
        "worker",
        "generate",
        "--server",
        "http://127.0.0.1:9",
        "--bootstrap",
        BOOTSTRAP,
        *flags,
    )


def tokenize(*flags: str) -> tuple[str, ...]:
    base = ("worker", "tokenize", "--tokenizer-dir", TOKENIZER, "--dataset", "v")
    return (*base, "--bootstrap", BOOTSTRAP, *flags)


def emulate(*flags: str) -> tuple[str, ...]:
    return ("emulate-server", "--tokenizer-dir", TOKENIZER, *flags)


CASES: dict[str, Case] = {
    # tracebacks before
    "out-ftp": Case(tokenize("--out", "ftp://x/y"), "--out"),
    "bootstrap-port": Case(generate("--bootstrap", "localhost:notaport"), "--bootstrap"),
    "bootstrap-port-range": Case(generate("--bootstrap", "h:70000"), "--bootstrap"),
    "session-timeout-text": Case(
        generate(), "DRAFTGEN_KAFKA_SESSION_TIMEOUT_S", {"DRAFTGEN_KAFKA_SESSION_TIMEOUT_S": "abc"}
    ),
    "security-protocol": Case(
        generate(),
        "DRAFTGEN_KAFKA_SECURITY_PROTOCOL",
        {"DRAFTGEN_KAFKA_SECURITY_PROTOCOL": "BOGUS"},
    ),
    "sasl-mechanism": Case(
        generate(), "DRAFTGEN_KAFKA_SASL_MECHANISM", {"DRAFTGEN_KAFKA_SASL_MECHANISM": "BOGUS"}
    ),
    "emulator-tokenizer": Case(
        ("emulate-server", "--tokenizer-dir", "/nonexistent/tokenizer"), "--tokenizer-dir"
    ),
    "emulator-port": Case(emulate("--port", "70000"), "--port"),
    "emulator-rate": Case(emulate("--fail-503-rate", "2"), "--fail-503-rate"),
    "emulator-min-output": Case(emulate("--min-output-tokens", "0"), "--min-output-tokens"),
    "emulator-min-over-max": Case(
        emulate("--min-output-tokens", "10", "--max-output-tokens", "5"), "--max-output-tokens"
    ),
    "emulator-speed-nan": Case(emulate("--tokens-per-s", "nan"), "--tokens-per-s"),
    # never exited before
    "prefix-publish": Case(
        ("publish", "--bootstrap", BOOTSTRAP, "--topic-prefix", "bad topic!"), "--topic-prefix"
    ),
    "prefix-tokenize": Case(
        tokenize("--out", "o", "--topic-prefix", "bad topic!"), "--topic-prefix"
    ),
    "prefix-env": Case(
        generate(), "DRAFTGEN_KAFKA_TOPIC_PREFIX", {"DRAFTGEN_KAFKA_TOPIC_PREFIX": "bad topic!"}
    ),
    "server-not-a-url": Case(generate("--server", "not-a-url"), "--server"),
    "server-ftp": Case(generate("--server", "ftp://host/x"), "--server"),
    "server-port": Case(generate("--server", "http://host:99999"), "--server"),
    "run-server": Case(("run", "--server", "not-a-url"), "--server"),
    # accepted though wrong before
    "top-p": Case(generate("--top-p", "5"), "--top-p"),
    "steal-after": Case(generate("--steal-after", "-1"), "--steal-after"),
    "claim-s": Case(generate("--claim-s", "0"), "--claim-s"),
    "steal-batch": Case(generate("--steal-batch", "-1"), "--steal-batch"),
    "idle-flush-negative": Case(tokenize("--out", "o", "--idle-flush", "-1"), "--idle-flush"),
    "idle-flush-nan": Case(tokenize("--out", "o", "--idle-flush", "nan"), "--idle-flush"),
    "timeout-inf": Case(
        ("seal", "--out", "o", "--dataset", "v", "--bootstrap", BOOTSTRAP, "--timeout", "inf"),
        "--timeout",
    ),
    "session-timeout-negative": Case(
        generate(), "DRAFTGEN_KAFKA_SESSION_TIMEOUT_S", {"DRAFTGEN_KAFKA_SESSION_TIMEOUT_S": "-5"}
    ),
    "out-empty": Case(tokenize("--out", ""), "--out"),
    "replication-zero": Case(generate("--replication-factor", "0"), "--replication-factor"),
    "insync-over-replicas": Case(
        generate("--replication-factor", "1", "--min-insync-replicas", "2"),
        "--min-insync-replicas",
    ),
    # the same rule for a dataset version wherever one is named
    "dataset-seal": Case(
        ("seal", "--out", "o", "--dataset", "../evil", "--bootstrap", BOOTSTRAP), "--dataset"
    ),
    "dataset-export": Case(
        ("export", "--out", "o", "--dataset", "../evil", "--format", "hf", "--to", "x"),
        "--dataset",
    ),
    "dataset-report": Case(("report", "--out", "o", "--dataset", "../evil"), "--dataset"),
    # the storage settings missing as a whole: the flag that gives them, not their variable
    "export-no-out": Case(
        ("export", "--dataset", "v", "--format", "hf", "--to", "x"), "--out is required"
    ),
    "dataset-env": Case(
        ("report", "--out", "o"), "DRAFTGEN_DATASET", {"DRAFTGEN_DATASET": "../evil"}
    ),
    "audit-bootstrap": Case(("audit", "--bootstrap", "h:70000"), "--bootstrap"),
    "audit-prefix": Case(
        ("audit", "--bootstrap", BOOTSTRAP, "--topic-prefix", "bad topic!"), "--topic-prefix"
    ),
    "audit-bootstrap-env": Case(("audit",), "DRAFTGEN_BOOTSTRAP", {"DRAFTGEN_BOOTSTRAP": "x"}),
    "audit-out-alone": Case(("audit", "--out", "o", "--bootstrap", BOOTSTRAP), "--dataset"),
    "audit-dataset": Case(
        ("audit", "--out", "o", "--dataset", "../evil", "--bootstrap", BOOTSTRAP), "--dataset"
    ),
    "report-bootstrap-env": Case(
        ("report", "--out", "o", "--dataset", "v"),
        "DRAFTGEN_BOOTSTRAP",
        {"DRAFTGEN_BOOTSTRAP": "x"},
    ),
}


# also run as real processes: a flag's value, an environment variable, a rule across fields, and
# a command whose flags come from outside the settings classes
IN_A_PROCESS = ("bootstrap-port", "session-timeout-text", "insync-over-replicas", "emulator-port")


@dataclass(frozen=True)
class Result:
    code: int | None  # None: still running at the deadline (killed)
    stderr: str
    cwd: Path


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTGEN_")}
    return {**env, **extra}


def draftgen(argv: list[str], env: dict[str, str], cwd: Path) -> Result:
    command = [sys.executable, "-m", "streams", *argv]
    try:
        done = subprocess.run(
            command, env=env, cwd=cwd, capture_output=True, text=True, timeout=DEADLINE_S
        )
    except subprocess.TimeoutExpired as expired:
        stderr = expired.stderr.decode() if isinstance(expired.stderr, bytes) else ""
        return Result(None, stderr, cwd)
    return Result(done.returncode, done.stderr, cwd)


@pytest.fixture(scope="module")
def bootstrap() -> str:
    return f"127.0.0.1:{unused_port()}"


def with_bootstrap(argv: tuple[str, ...], bootstrap: str) -> list[str]:
    return [bootstrap if a == BOOTSTRAP else a for a in argv]


@pytest.fixture(scope="module")
def processes(
    tmp_path_factory: pytest.TempPathFactory, bootstrap: str
) -> Iterator[dict[str, Result]]:
    python_path = {"PYTHONPATH": str(ROOT)}

    # made here, not in the threads: pytest's temp factory is not thread-safe
    cwds = {name: tmp_path_factory.mktemp(name) for name in IN_A_PROCESS}

    def run(name: str) -> Result:
        case = CASES[name]
        cwd = cwds[name]  # relative outputs land here, if anywhere
        argv = with_bootstrap(case.argv, bootstrap)
        return draftgen(argv, clean_env(**python_path, **case.env), cwd)

    with ThreadPoolExecutor(max_workers=4) as pool:
        yield dict(zip(IN_A_PROCESS, pool.map(run, IN_A_PROCESS), strict=True))


def in_process(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Result:
    """`draftgen argv` as `main` runs it: what a process would print and exit with."""
    for key in list(os.environ):
        if key.startswith("DRAFTGEN_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(cwd)
    capsys.readouterr()  # nothing of before
    try:
        code: int | str | None = main(argv)
    except SystemExit as stopped:  # argparse's own errors
        code = stopped.code
    return Result(code if isinstance(code, int) else 1, capsys.readouterr().err, cwd)


def only_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def check(result: Result, case: Case) -> None:
    line = only_line(result.stderr)
    assert result.code == 2, result.stderr
    assert line.startswith("draftgen ") and " error: " in line, line
    assert case.names in line, line
    # refused before anything was written (an empty --out once wrote dataset.json here)
    assert list(result.cwd.iterdir()) == []


@pytest.mark.parametrize("name", CASES)
def test_a_bad_setting_is_one_line_naming_it_and_status_2(
    name: str,
    bootstrap: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    case = CASES[name]
    argv = with_bootstrap(case.argv, bootstrap)
    check(in_process(argv, case.env, tmp_path, monkeypatch, capsys), case)


@pytest.mark.parametrize("name", IN_A_PROCESS)
def test_the_entry_point_prints_the_same_one_line(processes: dict[str, Result], name: str) -> None:
    result = processes[name]
    assert result.code is not None, f"still running after {DEADLINE_S}s: {result.stderr}"
    check(result, CASES[name])


def test_a_port_in_use_is_one_line_and_status_1(tmp_path: Path) -> None:
    """A failure at run time, not a bad value: one line all the same."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = draftgen(
            ["emulate-server", "--tokenizer-dir", TOKENIZER, "--port", port],
            clean_env(PYTHONPATH=str(ROOT)),
            tmp_path,
        )
    assert result.code == 1, result.stderr
    line = only_line(result.stderr)
    assert line.startswith("draftgen emulate-server: error: ") and port in line, line


def test_a_source_that_cannot_be_reached_is_one_line_and_status_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`publish hf:org/x` without network: what datasets raises (HF_HUB_OFFLINE=1 raises the
    same), after the broker was reached (faked here: the real one needs Kafka)."""
    import producers.publish

    async def publish(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach 'org/x' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(producers.publish, "publish", publish)
    code = main(["publish", "hf:org/x", "--bootstrap", "127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 1
    line = only_line(err)
    assert line.startswith("draftgen publish: error: ConnectionError: Couldn't reach 'org/x'"), line
    assert "--log-level DEBUG" in line  # where the traceback is


def test_a_broker_that_cannot_be_reached_is_one_line(tmp_path: Path) -> None:
    """aiokafka's own "Unable connect" ERROR is not printed before the command's line."""
    source = tmp_path / "one.jsonl"
    source.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    bootstrap = f"127.0.0.1:{unused_port()}"
    result = draftgen(
        ["publish", str(source), "--bootstrap", bootstrap],
        clean_env(PYTHONPATH=str(ROOT)),
        tmp_path,
    )
    assert result.code == 2, result.stderr
    line = only_line(result.stderr)
    assert line.startswith("draftgen publish: error: ") and bootstrap.split(":")[1] in line, line


def test_audit_without_a_broker_is_one_line_and_status_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not 1: `audit` exits 1 when prompts have no outcome, so an error must not look like it."""
    bootstrap = f"127.0.0.1:{unused_port()}"
    for argv in (["audit"], ["audit", "--republish"], ["audit", "--as-json"]):
        result = in_process([*argv, "--bootstrap", bootstrap], {}, tmp_path, monkeypatch, capsys)
        assert result.code == 2, result.stderr
        line = only_line(result.stderr)
        assert line.startswith("draftgen audit: error: ") and bootstrap.split(":")[1] in line, line
