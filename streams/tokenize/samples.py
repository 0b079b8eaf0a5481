"""Completion records → training samples (token ids + loss mask), with drift measurement.

Two token sources (see docs/design.md, "Tokens and loss masks"):

- ``server``: the ids the target produced, ``prompt_token_ids + output_token_ids``; the loss
  mask is 0 over the prompt (including a prefilled ``<think>``) and 1 over the output.
- ``rendered``: the prompt rendered by the target's chat template with the generation prompt
  and the thinking the server was asked for (the record's ``chat_template_kwargs``; on when
  it has none), followed by the generated turn rendered in the family's own format
  (streams/core/families/; rendering.py). The turn is appended rather than rendered by the
  template because templates blank or trim history reasoning; appending keeps the final
  reasoning exactly (for Qwen, the model's own whitespace too, when the record has it). The
  mask is 1 exactly over the turn, end-of-turn token included.
  tests/streams/tokenize/test_agreement.py checks that the rendered ids equal the server's on
  the cases that matter.

The rendered sample is ``ids(prompt) + ids(turn)``, each encoded on its own, as at inference:
the server encodes the prompt alone and the model then samples the turn's tokens. Encoding
``prompt + turn`` as one text would merge tokens across the boundary (Qwen: the prefilled
``<think>\n`` and a turn starting ``\n</think>`` become one ``\n\n`` token), a sequence
the model never sees.

When a completion has the server's ids, the rendered ids are also computed (if
``measure_drift``) and compared with ``prompt_token_ids + output_token_ids``, so that
template or tokenizer drift is visible; a drifted sample carries its cause (`DriftCause`: the
prompt or the turn, and the first differing token decoded on both sides). Texts are encoded
by `encoder.TextEncoder`: a checked tiktoken twin of the tokenizer where it has one, whose ids
the tokenizer's own replace wherever they differ from the server's.

A prompt is the server's tokenizer's encoding of the text it rendered, so where the server's
prompt ids spell the rendered prompt (the same text, the same added tokens; a decode, no BPE:
`TextEncoder.spells`) and the server tokenizes as this tokenizer does, they are its encoding:
the prompt is not encoded again (the encoding is most of the check's cost). That the server
tokenizes as this tokenizer does is checked as the builder runs: one such prompt of every batch
is encoded by the tokenizer, and so is every drifted sample; a difference and every prompt is
encoded from then on, with a warning (docs/failures.md).

The turn's ids the model sampled: what the drift check is for, the template's and the family
format's text (wrappers, think tags, tool-call syntax, end of turn) and the tokenizer's
vocabulary, is all in whether they spell the rendered turn (its bytes, its added tokens at their
places, its text NFC as the normalizer leaves it). So a turn they spell is not encoded either
when `encode_turns` is off (`--no-encode-turns`; on by default): what that leaves out is a
model that sampled its own text in other tokens than the text's encoding (a word as two
pieces), which is not drift of the template or the tokenizer, but is a sample a trainer
re-rendering the conversation would tokenize otherwise, so by default every turn is encoded
and it counts as drift; in a sample that drifted anyway, the turn is re-encoded like the rest.
Error kinds:
template_error, prefix_mismatch, bad_tool_arguments, bad_tool_call, bad_message,
bad_token_ids, token_out_of_range, too_few_loss_tokens, encode_error, bad_normalization.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from streams.core.families import FamilyProfile
from streams.core.records import CompletionRecord
from streams.core.serving import NEWEST, PROFILES, ServerNormalization
from streams.tokenize.drift import drift_cause, first_difference
from streams.tokenize.encoder import EncoderChoice, TextEncoder
from streams.tokenize.known_ids import NONE_KNOWN, Known, KnownIds
from streams.tokenize.rendering import RenderedText, Renderer
from streams.tokenize.sample_types import (
    TOKEN_SOURCES,
    DriftCause,
    Ids,
    Mask,
    Sample,
    SampleError,
    TokenSource,
)

__all__ = [
    "TOKEN_SOURCES",
    "DriftCause",
    "RenderedText",
    "Sample",
    "SampleBuilder",
    "SampleError",
    "TokenSource",
]


class SampleBuilder:
    """Builds samples for one tokenizer and model family; stateless between calls."""

    def __init__(
        self,
        tokenizer: Any,
        profile: FamilyProfile,
        prefer: str = "server",
        *,
        measure_drift: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
        min_loss_tokens: int = 1,
        encoder: EncoderChoice = "auto",
        encode_turns: bool = True,
    ) -> None:
        if prefer not in TOKEN_SOURCES:
            raise ValueError(f"prefer must be one of {TOKEN_SOURCES}, not {prefer!r}")
        self.tokenizer = tokenizer
        self.profile = profile
        self.prefer = cast(TokenSource, prefer)
        self.measure_drift = measure_drift
        self.min_loss_tokens = min_loss_tokens
        self.renderer = Renderer(tokenizer, profile, template_kwargs)
        self._vocab_size = len(tokenizer)
        self.encoder = TextEncoder(tokenizer, encoder)
        self.known_ids = KnownIds(self.encoder, encode_turns)

    @property
    def trust_server_prompts(self) -> bool:
        """Whether the server's prompt ids that spell a prompt still stand for its encoding."""
        return self.known_ids.trust_server_prompts

    # -- public ---------------------------------------------------------------------------

    def build(self, completion: CompletionRecord) -> Sample:
        result = self.build_many([completion])[0]
        if isinstance(result, SampleError):
            raise result
        return result

    def build_many(self, completions: Sequence[CompletionRecord]) -> list[Sample | SampleError]:
        """One result per completion, in order; all texts of the batch are encoded together."""
        results: list[Sample | SampleError | None] = [None] * len(completions)
        servers: dict[int, tuple[Ids, Ids] | None] = {}
        rendered: dict[int, RenderedText | SampleError] = {}
        for i, completion in enumerate(completions):
            server = _server_ids(completion, self._vocab_size)
            if isinstance(server, SampleError):
                results[i] = server
                continue
            servers[i] = server
            if server is None or self.prefer == "rendered" or self.measure_drift:
                try:
                    rendered[i] = self.render(completion)
                except SampleError as err:
                    rendered[i] = err

        # with rendered samples every text is encoded
        known = self.known_ids.find(servers, rendered) if self.prefer == "server" else {}
        encoded = self._encode(rendered, self.encoder.encode_batch, known)
        assembled = {i: self._assemble(server, encoded.get(i)) for i, server in servers.items()}
        if self.encoder.twin or known:
            self._confirm_drift(servers, rendered, encoded, assembled, known)
        for i, sample in assembled.items():
            if isinstance(sample, Sample):
                sample.normalization = completions[i].normalization or NEWEST.name
                self._name_normalization_drift(completions[i], sample, servers[i])
            results[i] = sample if isinstance(sample, SampleError) else self._checked(sample)
        return cast(list[Sample | SampleError], results)

    def render(
        self, completion: CompletionRecord, normalization: ServerNormalization | None = None
    ) -> RenderedText:
        """The prompt text (ending with the generation prompt) and the generated turn's text
        (rendering.py)."""
        return self.renderer.render(completion, normalization)

    def render_prompt(
        self, completion: CompletionRecord, normalization: ServerNormalization | None = None
    ) -> str:
        """The prompt text alone, as `render` gives it."""
        return self.renderer.render_prompt(completion, normalization)

    def _name_normalization_drift(
        self,
        completion: CompletionRecord,
        sample: Sample,
        server: tuple[Ids, Ids] | None,
    ) -> None:
        """A prompt that drifted is rendered again as every other SGLang version range would:
        one whose ids are the server's names the cause (the server preprocesses as another
        version does: `--normalization`, or a server that misreports its version). Only for
        drifted samples, with the tokenizer's own encoder."""
        cause = sample.drift_cause
        if server is None or cause is None or cause.side != "prompt":
            return
        server_prompt = server[0]
        for profile in reversed(list(PROFILES.values())):
            if profile.name == sample.normalization:
                continue
            try:
                text = self.render_prompt(completion, profile)
                [ids] = self.encoder.reference([text])
            except SampleError:
                continue
            if np.array_equal(np.asarray(ids, dtype=np.int32), server_prompt):
                sample.drift_cause = DriftCause(
                    cause.side, cause.position, cause.server, cause.rendered, profile.name
                )
                return

    # -- tokens ---------------------------------------------------------------------------

    def _encode(
        self,
        rendered: Mapping[int, RenderedText | SampleError],
        encode_batch: Callable[[Sequence[str]], list[list[int]]],
        known: Mapping[int, Known] | None = None,
    ) -> dict[int, tuple[Ids, int] | SampleError]:
        """(ids, prompt length) per rendered completion, from one batch encode: the prompt and
        the turn encoded separately, as the server encodes the prompt and the model samples;
        where `known` gives a prompt's or turn's ids, they are taken and that text not encoded."""
        known = known or {}
        pieces = {
            i: [
                text
                for text, ids in zip(
                    (item.prompt, item.turn), known.get(i, NONE_KNOWN), strict=True
                )
                if ids is None
            ]
            for i, item in rendered.items()
            if isinstance(item, RenderedText)
        }
        try:
            batch: list[list[int]] | None = encode_batch(
                [text for texts in pieces.values() for text in texts]
            )
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # incl. tiktoken's PanicException: retry one by one below
            batch = None
        out: dict[int, tuple[Ids, int] | SampleError] = {}
        position = 0
        for i, item in rendered.items():
            if isinstance(item, SampleError):
                out[i] = item
                continue
            texts = pieces[i]
            if batch is not None:
                lists = batch[position : position + len(texts)]
                position += len(texts)
            else:
                try:
                    lists = encode_batch(texts)
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as err:
                    out[i] = SampleError("encode_error", f"{type(err).__name__}: {err}")
                    continue
            given = known.get(i)
            if given is None:
                prompt_ids, turn_ids = lists
                out[i] = (np.array(prompt_ids + turn_ids, dtype=np.int32), len(prompt_ids))
                continue
            parts = iter(lists)
            prompt, turn = (
                ids if ids is not None else np.array(next(parts), dtype=np.int32) for ids in given
            )
            out[i] = (np.concatenate([prompt, turn]), len(prompt))
        return out

    def _confirm_drift(
        self,
        servers: Mapping[int, tuple[Ids, Ids] | None],
        rendered: Mapping[int, RenderedText | SampleError],
        encoded: Mapping[int, tuple[Ids, int] | SampleError],
        assembled: dict[int, Sample | SampleError],
        known: Mapping[int, Known],
    ) -> None:
        """A drift measured with the twin's ids or known ids is re-measured with the
        tokenizer's own encoding of both, so that a drift is the tokenizer's, never the twin's
        (encoder.py) nor the server's prompt ids' (known_ids.py); a known turn that is not the
        encoding of its text (the model sampled another spelling) is drift, as when encoded."""
        drifted = {
            i: rendered[i]
            for i, sample in assembled.items()
            if isinstance(sample, Sample) and sample.drift
        }
        if not drifted:
            return
        for i, confirmed in self._encode(drifted, self.encoder.reference).items():
            ours = encoded[i]
            if _same_encoding(confirmed, ours):
                continue
            prompt, turn = known.get(i, NONE_KNOWN)
            if prompt is not None and not _same_prompt(confirmed, ours):
                self.known_ids.distrust("a drifted sample")
            if turn is None and not _same_turn(confirmed, ours):
                self.encoder.disable("a sample whose ids differ from the server's")
            assembled[i] = self._assemble(servers[i], confirmed)

    def _assemble(
        self, server: tuple[Ids, Ids] | None, rendered: tuple[Ids, int] | SampleError | None
    ) -> Sample | SampleError:
        """The sample from the server's checked ids and/or the rendering's (not yet
        `_checked`)."""
        if server is None or self.prefer == "rendered":
            if rendered is None or isinstance(rendered, SampleError):
                return rendered or SampleError("internal", "completion was not rendered")
            ids, prompt_len = rendered
            sample = Sample(ids, _mask(prompt_len, len(ids) - prompt_len), "rendered")
        else:
            prompt_ids, output_ids = server
            ids = np.concatenate([prompt_ids, output_ids])
            sample = Sample(ids, _mask(len(prompt_ids), len(output_ids)), "server")
        if server is not None and isinstance(rendered, tuple):
            server_all = (
                sample.input_ids if sample.token_source == "server" else np.concatenate(server)
            )
            sample.drift = not np.array_equal(rendered[0], server_all)
            if sample.drift:
                sample.drift_position = first_difference(rendered[0], server_all)
                sample.drift_cause = drift_cause(self.tokenizer, server, rendered)
        return sample

    def _checked(self, sample: Sample) -> Sample | SampleError:
        top = int(sample.input_ids.max()) if len(sample.input_ids) else -1
        if top >= self._vocab_size:
            return SampleError(
                "token_out_of_range", f"token id {top} >= vocabulary size {self._vocab_size}"
            )
        loss = sample.num_loss_tokens
        if loss < self.min_loss_tokens:
            return SampleError(
                "too_few_loss_tokens", f"{loss} supervised tokens (< {self.min_loss_tokens})"
            )
        return sample


# -- helpers -------------------------------------------------------------------------------


def _server_ids(
    completion: CompletionRecord, vocab_size: int
) -> tuple[Ids, Ids] | SampleError | None:
    """The server's (prompt, output) ids as int32 arrays, checked before any sample is built
    from them: integers, `0 <= id < vocab_size`, a non-empty output. One numpy pass each."""
    prompt, output = completion.prompt_token_ids, completion.output_token_ids
    if prompt is None and output is None:
        return None
    if prompt is None or output is None:
        return SampleError("bad_token_ids", "only one of prompt/output token ids is present")
    if len(output) == 0:
        return SampleError("bad_token_ids", "the server returned no output token ids")
    arrays: list[Ids] = []
    for name, ids in (("prompt", prompt), ("output", output)):
        try:
            array = np.asarray(ids)
        except ValueError:
            array = np.asarray([], dtype=object)
        if len(ids) and (array.ndim != 1 or array.dtype.kind not in "iu"):
            return SampleError("bad_token_ids", f"{name} token ids are not all integers")
        if array.size:
            low, high = int(array.min()), int(array.max())
            if low < 0 or high >= vocab_size:
                bad = low if low < 0 else high
                return SampleError(
                    "token_out_of_range",
                    f"{name} token id {bad} outside [0, {vocab_size}) (the vocabulary)",
                )
        arrays.append(array.astype(np.int32))  # < vocab_size: fits the shard's int32 column
    return arrays[0], arrays[1]


def _mask(zeros: int, ones: int) -> Mask:
    mask = np.zeros(zeros + ones, dtype=np.int8)
    mask[zeros:] = 1
    return mask


def _same_encoding(
    a: tuple[Ids, int] | SampleError | None, b: tuple[Ids, int] | SampleError | None
) -> bool:
    if not (isinstance(a, tuple) and isinstance(b, tuple)):
        return False
    return a[1] == b[1] and np.array_equal(a[0], b[0])


def _same_prompt(a: tuple[Ids, int] | SampleError, b: tuple[Ids, int] | SampleError) -> bool:
    if not (isinstance(a, tuple) and isinstance(b, tuple)):
        return False
    return np.array_equal(a[0][: a[1]], b[0][: b[1]])


def _same_turn(a: tuple[Ids, int] | SampleError, b: tuple[Ids, int] | SampleError) -> bool:
    if not (isinstance(a, tuple) and isinstance(b, tuple)):
        return False
    return np.array_equal(a[0][a[1] :], b[0][b[1] :])
