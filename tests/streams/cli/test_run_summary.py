"""`draftgen run`: policy and drift flags reach the tokenize worker; the summary reports them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from sinks.shards import ShardStore
from streams.cli.flags import build, settings_file
from streams.cli.main import build_parser
from streams.cli.run import (
    TOKENIZE_FLAGS,
    not_built_before,
    tokenize_group,
    write_settings,
)
from streams.cli.run_summary import print_summary
from streams.cli.run_wait import RunResult
from streams.core.settings import (
    KafkaSettings,
    PublishSettings,
    SamplePolicy,
    StorageSettings,
    TokenizeSettings,
)
from streams.core.settings.base import SafeName
from streams.tools.progress import DatasetFigures, DeadLetterTally
from tests.sinks.sink_harness import rows


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
    # and a kept stack holds other runs' letters ("other"): one line, not in this run's figures
    tally = DeadLetterTally(
        by_reason=Counter(
            {
                ("tokenize", "policy_length"): 6,
                ("generate", "regen_stopped"): 1,
                ("publish", "bad_shape"): 2,
            }
        ),
        prompt_ids={"p0", "h", "other"},
        stage_ids={"tokenize": {"p0"}, "generate": {"h"}, "publish": {"other"}},
        reasons={
            "p0": {("tokenize", "policy_length")},
            "h": {("generate", "regen_stopped")},
            "other": {("publish", "bad_shape")},
        },
    )
    ids = {f"p{i}" for i in range(39)} | {"h"}
    print_summary(RunResult(figures, tally, ids, 1.5), "s3://b/ds", Path("w"))
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
    assert "bad_shape" not in out
    assert "(and 1 prompts of other runs on this stack: draftgen dead-letters)" in out


def test_summary_says_when_drift_was_not_measured(capsys: pytest.CaptureFixture[str]) -> None:
    print_summary(RunResult(DatasetFigures(), DeadLetterTally(), set(), 0.1), "x", Path("w"))
    out = capsys.readouterr().out
    assert "drift        not measured" in out and "truncated" not in out


def test_summary_says_how_many_prompts_were_generated_now_and_before(
    capsys: pytest.CaptureFixture[str],
) -> None:
    figures = DatasetFigures(samples=41)
    print_summary(
        RunResult(figures, DeadLetterTally(), {f"p{i}" for i in range(41)}, 2.0),
        "x",
        Path("w"),
        before=41,
    )
    out = capsys.readouterr().out
    assert "done in 2.0s: 41 prompts\n" in out
    assert "  prompts      0 generated now, 41 from before (built from their stored" in out


def test_a_new_version_gets_a_group_of_its_own_and_an_existing_one_keeps_its_own() -> None:
    kafka = KafkaSettings(bootstrap="b:1", topic_prefix="t1-")
    # a group named after the dataset alone may have read past earlier runs' completions
    first, second = (tokenize_group(None, kafka, "sample") for _ in range(2))
    assert first.startswith("draftgen-tokenize-sample-") and first != second
    long = tokenize_group(None, kafka, "d" * 100)
    assert TypeAdapter(SafeName).validate_python(long) == long  # a valid group_id
    # the manifest holds the group with the topic prefix; the settings take it without
    existing = {"consumer_group": "t1-draftgen-tokenize-sample-0a1b2c3d"}
    assert tokenize_group(existing, kafka, "sample") == "draftgen-tokenize-sample-0a1b2c3d"
    assert tokenize_group({}, kafka, "sample") == "draftgen-tokenize-sample"


def test_a_run_into_an_existing_version_without_its_earlier_prompts_is_refused(
    tmp_path: Path,
) -> None:
    store = ShardStore(str(tmp_path), "v1")
    store.write_shard(0, 0, 0, rows("a"), epoch=1)
    existing = {"consumer_group": "g"}
    assert not_built_before(existing, store, ["a"]) is None
    assert not_built_before(None, store, ["a", "b"]) is None  # a new version reads them all
    refused = not_built_before(existing, store, ["a", "b"])
    assert refused is not None and refused.startswith("1 prompts were generated before")
