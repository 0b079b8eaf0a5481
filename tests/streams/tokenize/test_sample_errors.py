"""SampleBuilder: every failure is the completion's own error, in order, never the batch's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from streams.core.records import CompletionRecord
from streams.core.serving import NEWEST
from streams.tokenize.samples import (
    Sample,
    SampleBuilder,
    SampleError,
)
from tests.ids import as_list
from tests.streams.tokenize.sample_cases import (
    TOOLS,
    Family,
    split,
)


def _fresh(fam: Family, load_tokenizer: Callable[[Path], Any], template: str | None) -> Any:
    tokenizer = load_tokenizer(fam.directory)
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def test_template_error(fam: Family, load_tokenizer: Callable[[Path], Any]) -> None:
    tokenizer = _fresh(fam, load_tokenizer, "{{ raise_exception('broken template') }}")
    completion = CompletionRecord(
        prompt_id="p", messages=[{"role": "user", "content": "hi"}], content="hello"
    )
    with pytest.raises(SampleError) as err:
        SampleBuilder(tokenizer, fam.profile).build(completion)
    assert err.value.kind == "template_error" and "broken template" in err.value.message


def test_prompt_ending_in_plain_text_is_not_merged_with_the_turn(
    fam: Family, load_tokenizer: Callable[[Path], Any]
) -> None:
    """A generation prompt ending in plain text would merge with the turn's first word if
    encoded as one text; the prompt is encoded alone, as the server encodes it."""
    template = fam.tokenizer.chat_template.replace(
        "'<think>\\n'" if fam.name == "qwen36" else "'<think>'", "'Reasoning: '"
    )
    assert template != fam.tokenizer.chat_template
    tokenizer = _fresh(fam, load_tokenizer, template)
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "hi"}],
        reasoning_content="the answer",
        content="ok",
    )
    builder = SampleBuilder(tokenizer, fam.profile)
    rendered = builder.render(completion)
    assert rendered.prompt.endswith("Reasoning: ")
    sample = builder.build(completion)
    prompt_ids = tokenizer(rendered.prompt, add_special_tokens=False)["input_ids"]
    turn_ids = tokenizer(rendered.turn, add_special_tokens=False)["input_ids"]
    assert as_list(sample.input_ids) == prompt_ids + turn_ids
    assert as_list(sample.loss_mask) == [0] * len(prompt_ids) + [1] * len(turn_ids)


def test_build_many_keeps_order_and_reports_errors(fam: Family) -> None:
    good = CompletionRecord(
        prompt_id="a",
        messages=[{"role": "user", "content": "hi"}],
        reasoning_content="Hm.",
        content="yo",
    )
    server = replace(good, prompt_token_ids=[1], output_token_ids=[2, 3])
    half = replace(good, prompt_token_ids=[1])
    empty = replace(good, prompt_token_ids=[1, 2], output_token_ids=[])
    huge = replace(good, prompt_token_ids=[1], output_token_ids=[len(fam.tokenizer)])
    results = fam.builder(measure_drift=False).build_many([good, half, server, empty, huge])
    assert isinstance(results[0], Sample) and results[0].token_source == "rendered"
    assert isinstance(results[2], Sample) and as_list(results[2].input_ids) == [1, 2, 3]
    kinds = [r.kind if isinstance(r, SampleError) else None for r in results]
    assert kinds == [None, "bad_token_ids", None, "bad_token_ids", "token_out_of_range"]


@pytest.mark.parametrize(
    ("prompt_ids", "output_ids", "kind"),
    [
        ([1, 2], [-1, 3], "token_out_of_range"),
        ([-5], [3], "token_out_of_range"),
        ([1], "VOCAB", "token_out_of_range"),
        ([1], [2.5], "bad_token_ids"),
        (["1"], [2], "bad_token_ids"),
        ([1], [[2]], "bad_token_ids"),
        ([1], [], "bad_token_ids"),
        ([], [], "bad_token_ids"),
        ([1], None, "bad_token_ids"),
    ],
)
def test_server_ids_are_checked_before_a_sample_is_built(
    fam: Family, prompt_ids: Any, output_ids: Any, kind: str
) -> None:
    """Records built in code skip the decode point's checks: the builder checks again,
    with the vocabulary it knows."""
    if output_ids == "VOCAB":
        output_ids = [len(fam.tokenizer)]
    completion = CompletionRecord(
        prompt_id="a",
        messages=[{"role": "user", "content": "hi"}],
        content="yo",
        prompt_token_ids=prompt_ids,
        output_token_ids=output_ids,
    )
    for drift in (False, True):
        result = fam.builder(measure_drift=drift).build_many([completion])[0]
        assert isinstance(result, SampleError) and result.kind == kind, result


def test_an_encoding_failure_rejects_only_its_completion(families: dict[str, Family]) -> None:
    qwen = families["qwen36"]

    class Backend:
        def encode_batch_fast(self, texts: list[str], add_special_tokens: bool) -> Any:
            if any("BOOM" in text for text in texts):
                raise RuntimeError("cannot encode BOOM")
            return qwen.tokenizer.backend_tokenizer.encode_batch_fast(texts, add_special_tokens)

    class Tokenizer:
        backend_tokenizer = Backend()

        def __getattr__(self, name: str) -> Any:
            return getattr(qwen.tokenizer, name)

        def __len__(self) -> int:
            return len(qwen.tokenizer)

    base = CompletionRecord(
        prompt_id="p", messages=[{"role": "user", "content": "hi"}], reasoning_content="Hm."
    )
    batch = [replace(base, content="fine"), replace(base, content="BOOM"), base]
    results = SampleBuilder(Tokenizer(), qwen.profile).build_many(batch)
    assert isinstance(results[0], Sample) and isinstance(results[2], Sample)
    assert isinstance(results[1], SampleError) and results[1].kind == "encode_error"
    assert results[0] == qwen.builder().build(batch[0])


def test_qwen_rejects_tool_arguments_that_are_not_json(families: dict[str, Family]) -> None:
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "hi"}],
        tools=TOOLS,
        tool_calls=[
            {
                "id": "c",
                "type": "function",
                "function": {"name": "search", "arguments": "{not json"},
            }
        ],
    )
    with pytest.raises(SampleError) as err:
        families["qwen36"].builder().build(completion)
    assert err.value.kind == "bad_tool_arguments"
    # Kimi prints the arguments verbatim, as the model wrote them
    sample = families["kimi_k26"].builder().build(completion)
    assert "{not json" in families["kimi_k26"].text(split(sample)[1])


def test_prefer_must_be_a_token_source(fam: Family) -> None:
    with pytest.raises(ValueError):
        fam.builder(prefer="tokens")


def test_prompt_with_tools_renders_as_the_server_renders_it(fam: Family) -> None:
    """SGLang hands the template its dump of each tool: the rendered prompt must be the
    server's, or every prompt with tools would count as drift."""
    from compose.emulator.chat import parse_chat_request, render_prompt
    from compose.emulator.model import EmulatedModel

    messages = [{"role": "user", "content": "Weather in Paris?"}]
    request = {
        "messages": messages,
        "tools": TOOLS,
        "chat_template_kwargs": fam.profile.template_kwargs(True),
    }
    model = EmulatedModel(fam.directory)
    chat = parse_chat_request(request, NEWEST, model.content_format)
    server_text, _ = render_prompt(model, chat)
    completion = CompletionRecord(prompt_id="p", messages=messages, tools=TOOLS, content="x")
    assert fam.builder().render(completion).prompt == server_text
