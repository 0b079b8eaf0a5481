"""`draftgen run`: policy and drift flags reach the tokenize worker; the summary reports them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from streams.cli.flags import build, settings_file
from streams.cli.main import build_parser
from streams.cli.run import TOKENIZE_FLAGS, RunResult, print_summary, write_settings
from streams.core.settings import (
    KafkaSettings,
    PublishSettings,
    SamplePolicy,
    StorageSettings,
    TokenizeSettings,
)
from streams.ops.progress import DatasetFigures, DeadLetterTally


def run_tokenize_settings(tmp_path: Path, *flags: str) -> TokenizeSettings:
    """What a tokenize worker started by `run` ends up with: run's flags → its settings file →
    the worker's own command line."""
    args = build_parser().parse_args(["run", *flags])
    settings = build(
        TokenizeSettings,
        args,
        only=TOKENIZE_FLAGS,
        tokenizer_dir="t",
        dataset="d",
        storage=StorageSettings(out="o"),
        kafka=KafkaSettings(bootstrap="b:1"),
    )
    path = write_settings(tmp_path, "tokenize", tokenize=settings)
    worker = build_parser().parse_args(["worker", "tokenize", "--settings", str(path)])
    return build(TokenizeSettings, worker, base=settings_file(worker)["tokenize"])


def test_run_passes_policy_and_drift_flags_to_the_tokenize_worker(tmp_path: Path) -> None:
    policy = ["--on-length", "keep", "--max-seq-len", "512", "--no-drift"]
    worker = run_tokenize_settings(tmp_path, "--regen", "every-turn", *policy)
    assert worker.policy == SamplePolicy(on_length="keep", max_seq_len=512)
    assert not worker.measure_drift
    assert worker.kafka.bootstrap == "b:1" and worker.storage.out == "o"
    defaults = run_tokenize_settings(tmp_path)
    assert defaults.measure_drift and defaults.policy == SamplePolicy()
    # run's --family is the generate workers' (the tokenize worker detects it from the template)
    assert run_tokenize_settings(tmp_path, "--family", "qwen3").family is None


def test_publish_takes_the_regen_mode() -> None:
    args = build_parser().parse_args(["publish", "--bootstrap", "b:1", "--regen", "every-turn"])
    assert build(PublishSettings, args).regen == "every-turn"
    assert build(PublishSettings, build_parser().parse_args(["publish"])).regen == "final"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["publish", "--regen", "sometimes"])


def test_summary_separates_policy_drops_from_dead_letters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    figures = DatasetFigures(samples=37, tokens=900, loss_tokens=400, shards=3, replaced=2)
    figures.compared, figures.drifted, figures.truncated = 37, 4, 2
    figures.drift_causes = Counter(
        {f"turn: server '{i}' vs rendered 'x'": 1 for i in range(5)}
        | {"prompt: server '<|im_end|>' vs rendered '<|im_start|>'": 3}
    )
    # the version's own drops come from its markers, once each
    figures.drops = {f"p{i}": "policy_length" for i in range(5)}
    figures.drops |= {"q0": "policy_unclosed_think", "q1": "policy_unclosed_think"}
    figures.drops["r"] = "bad_tool_arguments"
    # the dead-letters topic may hold a tokenize letter twice (a crash before the marker):
    # the summary does not count those, only the earlier stages'
    tally = DeadLetterTally(
        by_reason=Counter({("tokenize", "policy_length"): 6, ("generate", "regen_stopped"): 1}),
        prompt_ids={"p0", "h"},
        stage_ids={"tokenize": {"p0"}, "generate": {"h"}},
    )
    print_summary(RunResult(figures, tally, 40, 1.5), "s3://b/ds", Path("w"))
    out = capsys.readouterr().out
    assert "drift        4 of 37 compared samples (10.8%)" in out
    # the most frequent causes first, five at most
    assert (
        "differ from the template's rendering\n"
        "    prompt: server '<|im_end|>' vs rendered '<|im_start|>': 3\n"
        "    turn: server '0' vs rendered 'x': 1\n"
    ) in out
    assert "server '3' vs" in out and "server '4' vs" not in out
    assert "truncated    2 samples cut to --max-seq-len" in out
    assert "replaced     2 earlier answers" in out
    assert "policy drops 7 (by the sample policy, not failures)" in out
    assert "    length: 5\n    unclosed_think: 2\n" in out
    assert (
        "dead letters 2\n    generate/regen_stopped: 1\n    tokenize/bad_tool_arguments: 1\n" in out
    )


def test_summary_says_when_drift_was_not_measured(capsys: pytest.CaptureFixture[str]) -> None:
    print_summary(RunResult(DatasetFigures(), DeadLetterTally(), 0, 0.1), "x", Path("w"))
    out = capsys.readouterr().out
    assert "drift        not measured" in out and "truncated" not in out
