"""`draftgen run`: policy and drift flags reach the tokenize worker; the summary reports them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from streams.cli.args import policy_from_args
from streams.cli.main import build_parser
from streams.cli.run import RunResult, _tokenize_flags, print_summary
from streams.core.settings import SamplePolicy
from streams.ops.progress import DatasetFigures, DeadLetterTally


def test_run_passes_policy_and_drift_flags_to_the_tokenize_worker() -> None:
    policy = ["--on-length", "keep", "--max-seq-len", "512", "--no-drift"]
    args = build_parser().parse_args(["run", "--regen", "every-turn", *policy])
    assert args.regen == "every-turn"
    flags = _tokenize_flags(args)
    tokenize = ["worker", "tokenize", "--bootstrap", "b:1", "--tokenizer", "t", "--out", "o"]
    worker = build_parser().parse_args([*tokenize, "--dataset", "d", *flags])
    assert policy_from_args(worker) == SamplePolicy(length="keep", max_seq_len=512)
    assert worker.no_drift
    defaults = build_parser().parse_args(["run"])
    assert defaults.regen == "final" and not defaults.no_drift
    assert policy_from_args(defaults) == SamplePolicy()


def test_publish_takes_the_regen_mode() -> None:
    args = build_parser().parse_args(["publish", "--bootstrap", "b:1", "--regen", "every-turn"])
    assert args.regen == "every-turn"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["publish", "--regen", "sometimes"])


def test_summary_separates_policy_drops_from_dead_letters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    figures = DatasetFigures(samples=37, tokens=900, loss_tokens=400, shards=3)
    figures.compared, figures.drifted, figures.truncated = 37, 4, 2
    tally = DeadLetterTally(
        by_reason=Counter(
            {
                ("tokenize", "policy_length"): 5,
                ("tokenize", "policy_unclosed_think"): 2,
                ("generate", "regen_stopped"): 1,
            }
        ),
        prompt_ids={"a", "b", "c", "d", "e", "f", "g", "h"},
        policy_ids={"a", "b", "c", "d", "e", "f", "g"},
    )
    print_summary(RunResult(figures, tally, 40, 1.5), "s3://b/ds", Path("w"))
    out = capsys.readouterr().out
    assert "drift        4 of 37 compared samples (10.8%)" in out
    assert "truncated    2 samples cut to --max-seq-len" in out
    assert "policy drops 7 (dropped by the sample policy, not failures)" in out
    assert "    length: 5\n    unclosed_think: 2\n" in out
    assert "dead letters 1\n    generate/regen_stopped: 1\n" in out


def test_summary_says_when_drift_was_not_measured(capsys: pytest.CaptureFixture[str]) -> None:
    print_summary(RunResult(DatasetFigures(), DeadLetterTally(), 0, 0.1), "x", Path("w"))
    out = capsys.readouterr().out
    assert "drift        not measured" in out and "truncated" not in out
