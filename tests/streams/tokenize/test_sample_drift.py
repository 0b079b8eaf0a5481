"""SampleBuilder: the server's ids kept as given; drift against the rendering, with its cause."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer

from streams.core.records import CompletionRecord
from streams.core.serving import NEWEST
from streams.tokenize.drift import drift_cause, first_difference
from streams.tokenize.sample_types import Ids
from streams.tokenize.samples import (
    DriftCause,
    Sample,
    SampleBuilder,
    SampleError,
)
from tests.ids import as_list
from tests.streams.tokenize.sample_cases import (
    SETTINGS,
    Family,
    completions,
    drifted,
    one_token,
    with_server_ids,
)


@SETTINGS
@given(data=st.data())
def test_server_ids_are_kept_as_given(fam: Family, data: st.DataObject) -> None:
    vocab = len(fam.tokenizer)
    prompt_ids = data.draw(st.lists(st.integers(0, vocab - 1), max_size=40))
    output_ids = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=40))
    completion = replace(
        data.draw(completions()), prompt_token_ids=prompt_ids, output_token_ids=output_ids
    )
    sample = fam.builder(measure_drift=False).build(completion)
    assert sample.token_source == "server"
    assert as_list(sample.input_ids) == prompt_ids + output_ids
    assert as_list(sample.loss_mask) == [0] * len(prompt_ids) + [1] * len(output_ids)
    assert sample.drift is None and sample.drift_position is None


@SETTINGS
@given(data=st.data())
def test_drift_is_measured_against_the_rendering(fam: Family, data: st.DataObject) -> None:
    completion = with_server_ids(fam, data.draw(completions()))
    assert completion.prompt_token_ids is not None and completion.output_token_ids is not None
    same = fam.builder().build(completion)
    assert (same.token_source, same.drift, same.drift_position) == ("server", False, None)

    position = data.draw(st.integers(0, len(completion.output_token_ids) - 1))
    output = list(completion.output_token_ids)
    output[position] = (output[position] + 1) % len(fam.tokenizer)
    drifted = replace(completion, output_token_ids=output)
    sample = fam.builder().build(drifted)
    assert (
        as_list(sample.input_ids) == as_list(completion.prompt_token_ids) + output
    )  # still the server's
    assert sample.drift is True
    assert sample.drift_position == len(as_list(completion.prompt_token_ids)) + position
    assert sample.drift_cause is not None and sample.drift_cause.side == "turn"
    assert sample.drift_cause.position == sample.drift_position

    rendered = fam.builder(prefer="rendered").build(drifted)
    assert rendered.token_source == "rendered" and rendered.drift is True
    assert as_list(rendered.input_ids) == as_list(completion.prompt_token_ids) + as_list(
        completion.output_token_ids
    )


def test_prompt_drift_names_the_prompt_and_the_tokens(fam: Family) -> None:
    completion, prompt, _ = drifted(fam)
    im_end = one_token(fam, "<|im_end|>")
    at = prompt.index(im_end)  # the end of the user's turn
    prompt[at] = one_token(fam, "</think>")  # the server's prompt has another token there
    sample = fam.builder().build(replace(completion, prompt_token_ids=prompt))
    assert sample.drift_cause == DriftCause("prompt", at, "'</think>'", "'<|im_end|>'")
    assert str(sample.drift_cause) == f"prompt: at {at} server '</think>' vs rendered '<|im_end|>'"
    assert sample.drift_cause.key == "prompt: server '</think>' vs rendered '<|im_end|>'"


def test_turn_drift_names_the_turn_and_the_tokens(fam: Family) -> None:
    completion, prompt, output = drifted(fam)
    original = output[1]
    output[1] = one_token(fam, "\n")
    sample = fam.builder().build(replace(completion, output_token_ids=output))
    rendered = repr(fam.tokenizer.decode([original]))
    assert sample.drift_cause == DriftCause("turn", len(prompt) + 1, "'\\n'", rendered)
    assert sample.drift_cause.key == f"turn: server '\\n' vs rendered {rendered}"


def test_a_missing_end_of_turn_is_a_length_drift(fam: Family) -> None:
    completion, prompt, output = drifted(fam)
    assert output[-1] == one_token(fam, "<|im_end|>")
    sample = fam.builder().build(replace(completion, output_token_ids=output[:-1]))
    cause = sample.drift_cause
    assert cause == DriftCause("turn", len(prompt) + len(output) - 1, None, "'<|im_end|>'")
    assert cause.key == "turn length: server (end) vs rendered '<|im_end|>'"


def test_a_long_token_is_cut_and_same_texts_show_their_ids() -> None:
    class Decoder:
        def decode(self, ids: list[int]) -> str:
            return "x" * 100 if ids[0] == 1 else "\ufffd"

    def ids(*values: int) -> Ids:
        return np.array(values, dtype=np.int32)

    long = drift_cause(Decoder(), (ids(1, 5), ids(9)), (ids(2, 5, 9), 2))
    assert long.side == "prompt" and long.position == 0
    assert long.server is not None and len(long.server) == 40 and long.server.endswith("…")
    same = drift_cause(Decoder(), (ids(1, 5), ids(3)), (ids(1, 5, 4), 2))
    assert (same.server, same.rendered) == ("'\ufffd' #3", "'\ufffd' #4")


def test_server_ids_skip_rendering_when_drift_is_off(fam: Family) -> None:
    class NoRendering:
        """A tokenizer that must not be used for rendering or encoding."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.added_tokens_decoder = inner.added_tokens_decoder

        def __len__(self) -> int:
            return len(self.inner)

        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"tokenizer.{name} used")

    builder = SampleBuilder(NoRendering(fam.tokenizer), fam.profile, measure_drift=False)
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "hi"}],
        prompt_token_ids=[1, 2, 3],
        output_token_ids=[4, 5],
    )
    assert (
        builder.build_many([completion] * 3)
        == [Sample([1, 2, 3, 4, 5], [0, 0, 0, 1, 1], "server", normalization=NEWEST.name)] * 3
    )


def test_drift_not_measured_when_rendering_fails(families: dict[str, Family]) -> None:
    qwen = families["qwen36"]  # its template refuses a conversation without a user query
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "system", "content": "no user turn"}],
        content="x",
        prompt_token_ids=[1, 2],
        output_token_ids=[3, 4],
    )
    sample = qwen.builder().build(completion)
    assert sample.token_source == "server" and sample.drift is None
    with pytest.raises(SampleError) as err:
        qwen.builder(prefer="rendered").build(completion)
    assert err.value.kind == "template_error"


# --- errors --------------------------------------------------------------------------------


# --- the server's prompt ids standing for the prompt's encoding ------------------------------


def _respelled(fam: Family, ids: list[int]) -> list[int]:
    """The same text, its first token of several bytes spelled as its bytes' tokens: not the
    tokenizer's encoding (as a server with another tokenizer would give)."""
    tokens = fam.tokenizer.convert_ids_to_tokens(ids)
    added = fam.tokenizer.get_added_vocab()
    at = next(i for i, t in enumerate(tokens) if len(t) > 1 and t not in added)
    return [*ids[:at], *fam.tokenizer.convert_tokens_to_ids(list(tokens[at])), *ids[at + 1 :]]


@pytest.mark.parametrize("encode_turns", [False, True])
def test_a_prompt_and_turn_the_server_spells_are_not_encoded_again(
    families: dict[str, Family], encode_turns: bool
) -> None:
    qwen = families["qwen36"]
    completion, _, _ = drifted(qwen)
    builder = qwen.builder(encode_turns=encode_turns)
    encoded: list[str] = []
    encode_batch = builder.encoder.encode_batch

    def spy(texts: Any) -> list[list[int]]:
        encoded.extend(texts)
        return encode_batch(texts)

    builder.encoder.encode_batch = spy  # type: ignore[method-assign]
    samples = builder.build_many([completion] * 3)
    assert [s.drift for s in samples if isinstance(s, Sample)] == [False] * 3
    assert builder.render_prompt(completion) not in encoded
    assert encoded == ([builder.render(completion).turn] * 3 if encode_turns else [])
    assert builder.trust_server_prompts


def test_prompt_ids_that_spell_but_do_not_encode_the_prompt_drift_and_end_the_trust(
    families: dict[str, Family], caplog: pytest.LogCaptureFixture
) -> None:
    """Checked on one prompt a batch (here the only one) and on every drifted sample: the
    drift is named as before, and every prompt is encoded from then on."""
    qwen = families["qwen36"]
    completion, prompt, output = drifted(qwen)
    other = _respelled(qwen, prompt)
    builder = qwen.builder()
    with caplog.at_level("WARNING"):
        sample = builder.build(replace(completion, prompt_token_ids=other))
    assert sample.drift is True and sample.drift_cause is not None
    assert sample.drift_cause.side == "prompt"
    assert sample.drift_position == first_difference(np.array(prompt), np.array(other))
    assert not builder.trust_server_prompts
    assert "encoding every prompt from now on" in caplog.text
    # a drifted sample that is not the batch's checked prompt: re-encoded, its prompt named
    later = qwen.builder()
    respelled_and_drifted = replace(completion, prompt_token_ids=other, output_token_ids=output[1:])
    samples = later.build_many([completion, respelled_and_drifted])
    assert isinstance(samples[1], Sample) and samples[1].drift_cause is not None
    assert samples[1].drift_cause.side == "prompt" and not later.trust_server_prompts


@st.composite
def served(draw: st.DrawFn, fam: Family) -> CompletionRecord:
    """A completion with the server's ids, as a server gives them or changed as drift changes
    them: a token of the prompt or turn replaced, the turn cut or lengthened, a prompt token
    spelled as its bytes (another tokenizer)."""
    change = draw(
        st.sampled_from(["none", "prompt", "turn", "cut", "longer", "respelled", "verbatim"])
    )
    completion = draw(completions())
    if change == "verbatim":  # characters NFC composes, sampled as they are
        completion.content += draw(st.sampled_from(["e\u0301", "\u1100\u1161", ">\u0338"]))
    completion = with_server_ids(fam, completion)
    prompt, output = as_list(completion.prompt_token_ids), as_list(completion.output_token_ids)
    vocab = len(fam.tokenizer)
    if change == "prompt" and prompt:
        at = draw(st.integers(0, len(prompt) - 1))
        prompt[at] = (prompt[at] + draw(st.integers(1, vocab - 1))) % vocab
    elif change == "turn":
        at = draw(st.integers(0, len(output) - 1))
        output[at] = (output[at] + draw(st.integers(1, vocab - 1))) % vocab
    elif change == "cut" and len(output) > 1:
        output = output[: draw(st.integers(1, len(output) - 1))]
    elif change == "longer":
        output = [*output, draw(st.integers(0, vocab - 1))]
    elif change == "respelled" and any(len(t) > 1 for t in _plain_tokens(fam, prompt)):
        prompt = _respelled(fam, prompt)
    elif change == "verbatim":
        output = _unnormalized(fam, fam.builder().render(completion).turn) or output
    return replace(completion, prompt_token_ids=prompt, output_token_ids=output)


def _unnormalized(fam: Family, text: str) -> list[int] | None:
    """The text's tokens without the normalizer: ids that spell the text as it is."""
    backend = getattr(fam.tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    raw = Tokenizer.from_str(backend.to_str())
    raw.normalizer = None
    return list(raw.encode(text, add_special_tokens=False).ids)


def _plain_tokens(fam: Family, ids: list[int]) -> list[str]:
    added = fam.tokenizer.get_added_vocab()
    return [t for t in fam.tokenizer.convert_ids_to_tokens(ids) if t not in added]


def _facts(sample: Sample | SampleError) -> tuple[Any, ...]:
    if isinstance(sample, SampleError):
        return (sample.kind, sample.message)
    return (
        sample.input_ids.dtype.str,
        sample.input_ids.tobytes(),
        sample.loss_mask.tobytes(),
        sample.token_source,
        sample.drift,
        sample.drift_position,
        sample.drift_cause,
        sample.normalization,
    )


@SETTINGS
@given(data=st.data())
def test_turns_spelled_by_the_server_give_the_samples_of_encoded_turns(
    fam: Family, data: st.DataObject
) -> None:
    """Not encoding a turn whose ids spell it changes no sample: ids, mask, drift and cause
    are the same byte for byte, batch by batch, whatever the server's ids (its tokenizer's
    turns, changed, cut, lengthened, prompts spelled otherwise)."""
    batches = data.draw(st.lists(st.lists(served(fam), min_size=1, max_size=4), max_size=3))
    spelled, encoded = fam.builder(encode_turns=False), fam.builder()
    for batch in batches:
        ours = [_facts(s) for s in spelled.build_many(batch)]
        theirs = [_facts(s) for s in encoded.build_many(batch)]
        assert ours == theirs
    assert spelled.encoder.twin == encoded.encoder.twin
    assert spelled.trust_server_prompts == encoded.trust_server_prompts


def test_a_turn_the_model_spelled_otherwise_is_drift_only_when_turns_are_encoded(
    families: dict[str, Family],
) -> None:
    """The model sampled its text in other tokens than the text's encoding (the same
    characters, a token as its bytes): not template or tokenizer drift, but a sample a
    re-rendering would tokenize otherwise, so drift by default (every turn encoded) and not
    with `encode_turns=False` (`--no-encode-turns`); the sample's ids are the server's either
    way. In a sample that drifted anyway, the turn is re-encoded like the rest."""
    qwen = families["qwen36"]
    completion, prompt, output = drifted(qwen)
    respelled = replace(completion, output_token_ids=_respelled(qwen, output))
    spelled = qwen.builder(encode_turns=False).build(respelled)
    default = qwen.builder().build(respelled)
    server = prompt + as_list(respelled.output_token_ids)
    assert as_list(spelled.input_ids) == as_list(default.input_ids) == server
    assert spelled.drift is False
    assert default.drift is True and default.drift_cause is not None
    assert default.drift_cause.side == "turn"
    both = replace(respelled, prompt_token_ids=prompt[:-1])
    builder = qwen.builder(encode_turns=False)
    sample = builder.build(both)
    assert sample.drift is True and sample.drift_cause is not None
    assert sample.drift_cause.side == "prompt"
    assert builder.encoder.twin and builder.trust_server_prompts
