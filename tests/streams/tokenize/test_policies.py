"""The sample policy: which completions the tokenize stage drops, truncates or keeps."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streams.cli.flags import add_flags, build
from streams.core.families import detect_family
from streams.core.records import CompletionRecord, is_policy_drop
from streams.core.settings import SamplePolicy
from streams.tokenize.policies import PolicyDrop, PolicySampleBuilder, longest_run
from streams.tokenize.samples import Sample, SampleBuilder, SampleError
from tests.ids import as_list

USER = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(params=["qwen36", "kimi_k26"])
def make_builder(
    request: pytest.FixtureRequest,
    qwen36_tokenizer_dir: Path,
    kimi_k26_tokenizer_dir: Path,
    load_tokenizer: Callable[[Path], Any],
) -> Callable[..., PolicySampleBuilder]:
    directory = qwen36_tokenizer_dir if request.param == "qwen36" else kimi_k26_tokenizer_dir
    tokenizer = load_tokenizer(directory)
    profile = detect_family(directory)

    def make(**policy: Any) -> PolicySampleBuilder:
        return PolicySampleBuilder(tokenizer, profile, policy=SamplePolicy(**policy))

    return make


def with_server_ids(builder: PolicySampleBuilder, completion: CompletionRecord) -> CompletionRecord:
    """The completion as the emulator would return it: its canonical rendering as ids."""
    sample = SampleBuilder(builder.tokenizer, builder.profile).build(completion)
    start = as_list(sample.loss_mask).index(1)
    return replace(
        completion,
        prompt_token_ids=sample.input_ids[:start],
        output_token_ids=sample.input_ids[start:],
    )


def answered(**fields: Any) -> CompletionRecord:
    values: dict[str, Any] = {
        "prompt_id": "p",
        "messages": USER,
        "reasoning_content": "Two and two make four.",
        "content": "4",
        "finish_reason": "stop",
    }
    values.update(fields)
    return CompletionRecord(**values)


def kind(result: Sample | SampleError) -> str | None:
    return result.kind if isinstance(result, SampleError) else None


def test_defaults_keep_a_normal_answer(make_builder: Callable[..., PolicySampleBuilder]) -> None:
    builder = make_builder()
    completion = with_server_ids(builder, answered())
    sample = builder.build(completion)
    assert sample.token_source == "server" and sample.drift is False and not sample.truncated


def test_length_is_dropped_by_default_or_kept(
    make_builder: Callable[..., PolicySampleBuilder],
) -> None:
    cut = answered(finish_reason="length", content="", reasoning_content="Two and two ma")
    result = make_builder().build_many([cut])[0]
    assert isinstance(result, PolicyDrop) and result.kind == "policy_length"
    assert result.rule == "length" and is_policy_drop(result.kind)
    # kept: judged by length alone, not as an empty answer or unclosed thinking
    kept = make_builder(on_length="keep").build(cut)
    assert kept.num_loss_tokens > 0


def test_unclosed_think_versus_empty_answer(
    make_builder: Callable[..., PolicySampleBuilder],
) -> None:
    builder = make_builder()
    unclosed = answered(content="", reasoning_content="I never close the block")
    assert kind(builder.build_many([unclosed])[0]) == "policy_unclosed_think"
    # the server's ids tell: no </think> among them is unclosed; with it, an empty answer
    closed = with_server_ids(builder, answered(content=""))
    close_id = builder.tokenizer.convert_tokens_to_ids("</think>")
    assert close_id in as_list(closed.output_token_ids)
    assert kind(builder.build_many([closed])[0]) == "policy_empty_answer"
    without = replace(
        closed, output_token_ids=[t for t in as_list(closed.output_token_ids) if t != close_id]
    )
    assert kind(builder.build_many([without])[0]) == "policy_unclosed_think"
    kept = make_builder(on_unclosed_think="keep").build_many([without])[0]
    assert isinstance(kept, Sample) and as_list(
        kept.input_ids[-len(as_list(without.output_token_ids)) :]
    ) == (without.output_token_ids)


def test_empty_answer(make_builder: Callable[..., PolicySampleBuilder]) -> None:
    empty = answered(content="  \n", reasoning_content=None)
    assert kind(make_builder().build_many([empty])[0]) == "policy_empty_answer"
    server = replace(empty, prompt_token_ids=[1, 2, 3], output_token_ids=[4, 5])
    kept = make_builder(on_empty_answer="keep").build_many([server])[0]
    assert isinstance(kept, Sample) and as_list(kept.input_ids) == [1, 2, 3, 4, 5]
    # a tool call is an answer
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert make_builder().check_completion(replace(empty, tool_calls=[call])) == ()


def test_max_seq_len_drops_or_truncates(make_builder: Callable[..., PolicySampleBuilder]) -> None:
    completion = answered(prompt_token_ids=list(range(10)), output_token_ids=list(range(10, 16)))
    assert kind(make_builder(max_seq_len=16).build_many([completion])[0]) is None
    assert kind(make_builder(max_seq_len=15).build_many([completion])[0]) == "policy_max_seq_len"

    cut = make_builder(max_seq_len=13, on_max_seq_len="truncate").build(completion)
    assert cut.truncated and as_list(cut.input_ids) == list(range(13))
    assert as_list(cut.loss_mask) == [0] * 10 + [1] * 3
    # cut into the prompt, or leaving one supervised token: too short a run for DFlash
    for limit in (10, 11):
        result = make_builder(max_seq_len=limit, on_max_seq_len="truncate").build_many(
            [completion]
        )[0]
        assert kind(result) == "policy_min_loss_run"
        assert "after truncation" in str(result)


def test_min_loss_run(make_builder: Callable[..., PolicySampleBuilder]) -> None:
    one = answered(prompt_token_ids=[1, 2], output_token_ids=[3])
    assert kind(make_builder().build_many([one])[0]) == "policy_min_loss_run"
    assert kind(make_builder(min_loss_run=1).build_many([one])[0]) is None
    two = replace(one, output_token_ids=[3, 4])
    assert kind(make_builder().build_many([two])[0]) is None


def test_build_many_keeps_order_and_skips_dropped(
    make_builder: Callable[..., PolicySampleBuilder],
) -> None:
    builder = make_builder()
    rendered: list[str] = []
    original = builder.render

    def render(completion: CompletionRecord) -> Any:
        rendered.append(completion.prompt_id)
        return original(completion)

    builder.render = render  # type: ignore[method-assign]
    batch = [
        answered(prompt_id="a"),
        answered(prompt_id="b", finish_reason="length"),
        answered(prompt_id="c", content="", reasoning_content="hmm"),
        answered(prompt_id="d", prompt_token_ids=[1], output_token_ids=[2]),
        answered(prompt_id="e", prompt_token_ids=[1], output_token_ids=[2, 3]),
    ]
    kinds = [kind(r) for r in builder.build_many(batch)]
    assert kinds == [None, "policy_length", "policy_unclosed_think", "policy_min_loss_run", None]
    assert "b" not in rendered and "c" not in rendered  # dropped before any encoding


def test_longest_run() -> None:
    assert longest_run([]) == 0
    assert longest_run([0, 0]) == 0
    assert longest_run([0, 1, 0, 1, 1, 1, 0, 1, 1]) == 3
    assert longest_run([1] * 5) == 5
    rng = np.random.default_rng(0)
    for _ in range(500):  # against the obvious loop
        mask = (rng.random(int(rng.integers(0, 40))) < 0.6).astype(np.int8)
        best = run = 0
        for bit in mask:
            run = run + 1 if bit else 0
            best = max(best, run)
        assert longest_run(mask) == best


def parse(*argv: str) -> SamplePolicy:
    parser = argparse.ArgumentParser()
    add_flags(parser, SamplePolicy)
    return build(SamplePolicy, parser.parse_args(argv))


def test_flags_and_defaults() -> None:
    assert parse() == SamplePolicy()
    assert SamplePolicy().max_seq_len is None and SamplePolicy().min_loss_run == 2
    policy = parse(
        "--on-length",
        "keep",
        "--on-unclosed-think",
        "keep",
        "--on-empty-answer",
        "keep",
        "--max-seq-len",
        "4096",
        "--on-max-seq-len",
        "truncate",
        "--min-loss-run",
        "3",
    )
    assert policy == SamplePolicy(
        on_length="keep",
        on_unclosed_think="keep",
        on_empty_answer="keep",
        max_seq_len=4096,
        on_max_seq_len="truncate",
        min_loss_run=3,
    )
    with pytest.raises(SystemExit):
        parse("--max-seq-len", "0")


@pytest.mark.parametrize("action", ["drop", "flag", "keep"])
def test_think_markers_are_dropped_flagged_or_kept_and_bad_tool_arguments_dropped(
    make_builder: Callable[..., PolicySampleBuilder], action: str
) -> None:
    builder = make_builder(on_think_markers=action)
    marker = answered(content="4 </think> and then")
    bad = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1'}}
    listed = {"id": "d", "type": "function", "function": {"name": "g", "arguments": "[1]"}}
    calls = [answered(content="", tool_calls=[call]) for call in (bad, listed)]
    good = {"id": "e", "type": "function", "function": {"name": "h", "arguments": '{"a": 1}'}}
    clean = [answered(), answered(content="", tool_calls=[good])]
    results = builder.build_many([marker, *calls, *clean])
    # a recorded drop of the policy, not an error: the model wrote them
    assert [kind(r) for r in results[1:]] == ["policy_tool_args"] * 2 + [None] * 2
    assert "not JSON" in str(results[1]) and "list, not an object" in str(results[2])
    if action == "drop":
        assert kind(results[0]) == "policy_think_markers"
        assert "a </think> with no <think> before it" in str(results[0])
    else:
        assert isinstance(results[0], Sample)
        assert results[0].flags == (("think_markers",) if action == "flag" else ())
    assert [r.flags for r in results[3:] if isinstance(r, Sample)] == [(), ()]


def looped(builder: PolicySampleBuilder, share: float) -> CompletionRecord:
    """A completion whose last `share` of its output ids is one 40-token block over and over."""
    text = " ".join(f"word{i} is not word{i + 1}" for i in range(200))
    completion = with_server_ids(builder, answered(content=text))
    output = as_list(completion.output_token_ids)
    start = int(len(output) * (1 - share))
    loop = [*np.resize(output[:40], len(output) - start - 1), output[-1]]  # ends as it did
    return replace(completion, output_token_ids=output[:start] + loop)


@pytest.mark.parametrize("action", ["drop", "flag", "keep"])
def test_an_output_that_loops_is_dropped_flagged_or_kept(
    make_builder: Callable[..., PolicySampleBuilder], action: str
) -> None:
    builder = make_builder(on_repetition=action)
    plain = with_server_ids(builder, answered(content=" ".join(f"w{i}" for i in range(400))))
    results = builder.build_many([looped(builder, 0.5), looped(builder, 0.1), plain])
    assert [r.flags for r in results[1:] if isinstance(r, Sample)] == [(), ()]
    if action == "drop":
        assert kind(results[0]) == "policy_repetition"
        assert "n-grams repeat" in str(results[0])
    else:
        assert isinstance(results[0], Sample)
        assert results[0].flags == (("repetition",) if action == "flag" else ())
    # below --repetition-min-tokens nothing is checked
    short = make_builder(on_repetition=action, repetition_min_tokens=100_000)
    assert all(isinstance(r, Sample) for r in short.build_many([looped(builder, 0.5)]))


def with_gate(completion: CompletionRecord, **gate: str) -> CompletionRecord:
    """The completion of a sample whose recipe sets these verdicts."""
    return replace(completion, policy={"recipe": "r", "sampling": {}, "gate": gate})


def test_a_recipes_gate_sets_the_verdicts_for_its_own_samples_only(
    make_builder: Callable[..., PolicySampleBuilder],
) -> None:
    builder = make_builder()  # the stage's flags: every rule drops
    marker, loop = answered(content="4 </think> and then"), looped(builder, 0.5)
    results = builder.build_many(
        [
            with_gate(marker, think_markers="flag"),
            marker,
            with_gate(loop, repetition="keep"),
            with_gate(loop, think_markers="keep"),  # another rule's verdict: loops still drop
            loop,
            with_gate(answered(content=" ", reasoning_content=None), empty_answer="keep"),
        ]
    )
    assert [kind(r) for r in results] == [
        None,
        "policy_think_markers",
        None,
        "policy_repetition",
        "policy_repetition",
        None,
    ]
    assert [r.flags for r in results if isinstance(r, Sample)] == [("think_markers",), (), ()]
    # and the other way: a recipe drops what the stage keeps
    keeping = make_builder(on_repetition="keep")
    assert kind(keeping.build_many([with_gate(loop, repetition="drop")])[0]) == "policy_repetition"
