"""Names that become paths, topics, groups and member ids are checked with a one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.cli.main import main

UNSAFE = ["../escape", "..", ".", "a/b", "a b", "", "_lead", "é", "x" * 101, "a\nb"]


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exit_:  # argparse's errors
        code = int(exit_.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("name", UNSAFE)
@pytest.mark.parametrize(
    "command",
    [
        ("worker", "tokenize", "--tokenizer-dir", "TOK", "--out", "OUT", "--dataset"),
        ("replay", "--tokenizer-dir", "TOK", "--out", "OUT", "--dataset"),
        ("worker", "generate", "--server", "http://s", "--instance-id"),
        ("status", "--out", "OUT", "--dataset"),
        ("run", "--dataset"),
    ],
    ids=["tokenize", "replay", "instance-id", "status", "run"],
)
def test_an_unsafe_name_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: tuple[str, ...], name: str
) -> None:
    argv = [a.replace("TOK", str(tmp_path)).replace("OUT", str(tmp_path / "out")) for a in command]
    code, err = run_main(capsys, *argv, name, "--bootstrap", "127.0.0.1:9")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "not a safe name" in lines[0], err
    assert not (tmp_path / "dataset.json").exists() and not list(tmp_path.glob("*/dataset.json"))


@pytest.mark.parametrize("prefix", ["a/b", "x y", "../", "p" * 101])
def test_an_unsafe_topic_prefix_is_refused_from_a_flag_or_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, prefix: str
) -> None:
    base = ("worker", "generate", "--server", "http://s", "--bootstrap", "127.0.0.1:9")
    code, err = run_main(capsys, *base, "--topic-prefix", prefix)
    assert code == 2 and err.count("\n") == 1 and "not a safe prefix" in err, err
    monkeypatch.setenv("DRAFTGEN_KAFKA_TOPIC_PREFIX", prefix)
    code, err = run_main(capsys, *base)
    assert code == 2 and err.count("\n") == 1 and "DRAFTGEN_KAFKA_TOPIC_PREFIX:" in err, err


@pytest.mark.parametrize("name", ["v1", "k26-v2.fixed", "A_b-3", "9" * 100])
def test_safe_names_pass(name: str) -> None:
    from streams.core.settings import (
        GenerateSettings,
        KafkaSettings,
        StorageSettings,
        TokenizeSettings,
    )

    kafka = KafkaSettings(bootstrap="b:1", topic_prefix=f"{name[:99]}-")
    TokenizeSettings(tokenizer_dir="t", dataset=name, storage=StorageSettings(out="o"), kafka=kafka)
    GenerateSettings(server="http://s", instance_id=name, kafka=kafka)
