"""Completion records → training samples (token ids + loss mask), with drift measurement.

Two token sources (see DESIGN.md, "Tokens and loss masks"):

- ``server``: the ids the target produced, ``prompt_token_ids + output_token_ids``; the loss
  mask is 0 over the prompt (including a prefilled ``<think>``) and 1 over the output.
- ``rendered``: the prompt rendered by the target's chat template with the generation prompt
  and the thinking the server was asked for (the record's ``chat_template_kwargs``; on when
  it has none), followed by the generated turn rendered in the family's own format. The
  turn is appended rather than rendered by the template because templates blank or trim
  history reasoning; appending keeps the final reasoning exactly (for Qwen, the model's own
  whitespace too, when the record has it: `_qwen_turn`). The mask is 1 exactly over the turn,
  end-of-turn token included. tests/streams/tokenize/test_agreement.py checks that the
  rendered ids equal the server's on the cases that matter.

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
the tokenizer's own replace wherever they differ from the server's. Error kinds:
template_error, prefix_mismatch, bad_tool_arguments, bad_tool_call, bad_message,
bad_token_ids, token_out_of_range, too_few_loss_tokens, encode_error, bad_normalization.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt

from streams.core.families import FamilyProfile
from streams.core.records import CompletionRecord, Message, equal_fields
from streams.core.serving import (
    NEWEST,
    PROFILES,
    ContentFormat,
    NormalizationError,
    ServerNormalization,
    detect_content_format,
    profile_named,
)
from streams.tokenize.encoder import EncoderChoice, TextEncoder

TokenSource = Literal["server", "rendered"]
TOKEN_SOURCES: tuple[TokenSource, ...] = ("server", "rendered")
# a decoded token in a drift cause, repr'd, is cut to this many characters
CAUSE_TOKEN_CHARS = 40
# a sample's ids and mask are numpy arrays of the shard's column types, from the record's
# packed ids or the encoder's lists straight to Arrow, with no Python int per token between
Ids = npt.NDArray[np.int32]
Mask = npt.NDArray[np.int8]


@dataclass(frozen=True)
class DriftCause:
    """Where the server's ids and the rendering first differ: in the prompt if the prompt ids
    differ (else in the turn), the position in the sample, and the token there on each side,
    decoded and repr'd (None: that side ended there, one is a prefix of the other)."""

    side: Literal["prompt", "turn"]
    position: int
    server: str | None
    rendered: str | None
    # the server's prompt is what another SGLang version's preprocessing renders (that
    # profile's name): a normalization difference, not the template's or the tokenizer's
    normalization: str | None = None

    @property
    def label(self) -> str:
        if self.normalization is not None:
            return "prompt normalization"
        length = self.server is None or self.rendered is None
        return f"{self.side} length" if length else self.side

    @property
    def key(self) -> str:
        """Without the position, so that counts of the same cause add up across samples."""
        if self.normalization is not None:
            return f"{self.label}: the server rendered as {self.normalization}"
        return (
            f"{self.label}: server {self.server or '(end)'} vs rendered {self.rendered or '(end)'}"
        )

    def __str__(self) -> str:
        return (
            f"{self.label}: at {self.position} server {self.server or '(end)'} "
            f"vs rendered {self.rendered or '(end)'}"
        )


@dataclass
class Sample:
    input_ids: Ids
    loss_mask: Mask
    token_source: TokenSource
    # rendered ids differ from the server's (None: not measured)
    drift: bool | None = None
    # first position where they differ (None: no drift or not measured)
    drift_position: int | None = None
    # why it drifted (None: no drift or not measured)
    drift_cause: DriftCause | None = None
    # cut to the policy's --max-seq-len (streams/policies.py)
    truncated: bool = False
    # the SGLang preprocessing profile the prompt was rendered with (streams/core/serving.py)
    normalization: str = ""

    def __eq__(self, other: object) -> bool:
        return equal_fields(self, other) if isinstance(other, Sample) else NotImplemented

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return int(np.count_nonzero(self.loss_mask))


class SampleError(Exception):
    """A completion that cannot become a sample; `kind` names the failure for dead letters."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


@dataclass
class RenderedText:
    """A completion rendered as text: the prompt (ending with the generation prompt) and the
    generated turn (exactly the supervised text)."""

    prompt: str
    turn: str


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
    ) -> None:
        if prefer not in TOKEN_SOURCES:
            raise ValueError(f"prefer must be one of {TOKEN_SOURCES}, not {prefer!r}")
        self.tokenizer = tokenizer
        self.profile = profile
        self.prefer = cast(TokenSource, prefer)
        self.measure_drift = measure_drift
        self.min_loss_tokens = min_loss_tokens
        # Every kwarg explicit: Kimi's remote code defaults add_generation_prompt=True.
        self._default_kwargs = profile.template_kwargs(thinking=True)
        self._explicit_kwargs = dict(template_kwargs or {})
        self._vocab_size = len(tokenizer)
        self.encoder = TextEncoder(tokenizer, encoder)
        # how SGLang flattens list content for this template (read when first rendering)
        self._content_format: ContentFormat | None = None

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

        encoded = self._encode(rendered, self.encoder.encode_batch)
        assembled = {i: self._assemble(server, encoded.get(i)) for i, server in servers.items()}
        if self.encoder.twin:
            self._confirm_drift(servers, rendered, encoded, assembled)
        for i, sample in assembled.items():
            if isinstance(sample, Sample):
                sample.normalization = completions[i].normalization or NEWEST.name
                self._name_normalization_drift(completions[i], sample, servers[i])
            results[i] = sample if isinstance(sample, SampleError) else self._checked(sample)
        return cast(list[Sample | SampleError], results)

    def render(
        self, completion: CompletionRecord, normalization: ServerNormalization | None = None
    ) -> RenderedText:
        """The prompt text (ending with the generation prompt) and the generated turn's text,
        the prompt as SGLang of the completion's profile (or `normalization`) renders it."""
        if normalization is None:
            normalization = self._normalization(completion)
        try:
            messages, tools = normalization.prepare(
                completion.messages, completion.tools, content_format=self.content_format
            )
        except NormalizationError as err:  # the server would have refused it
            raise SampleError("bad_tool_arguments", str(err)) from None
        generated = self._prepare(completion.generated_message())
        kwargs = normalization.template_kwargs(self._kwargs(completion))
        # a run with thinking off (`--no-thinking`): the prompt closes the think block itself
        thinking = not (
            self.profile.thinking_kwarg and kwargs.get(self.profile.thinking_kwarg) is False
        )
        prompt = self._apply_template(messages, tools, kwargs, add_generation_prompt=True)
        if self.profile.name == "kimi_k2":
            calls = _count_calls(messages)
            turn = _kimi_turn(generated, self.profile, completion, calls, thinking)
        elif self.profile.name == "qwen3":
            turn = _qwen_turn(generated, self.profile, completion, thinking)
        else:
            try:
                [as_history] = normalization.messages([completion.generated_message()])
            except NormalizationError as err:
                raise SampleError("bad_tool_arguments", str(err)) from None
            turn = self._template_turn(messages, as_history, tools, kwargs, prompt)
        return RenderedText(prompt, turn)

    def render_prompt(
        self, completion: CompletionRecord, normalization: ServerNormalization | None = None
    ) -> str:
        """The prompt text alone, as `render` gives it."""
        if normalization is None:
            normalization = self._normalization(completion)
        try:
            messages, tools = normalization.prepare(
                completion.messages, completion.tools, content_format=self.content_format
            )
        except NormalizationError as err:
            raise SampleError("bad_tool_arguments", str(err)) from None
        kwargs = normalization.template_kwargs(self._kwargs(completion))
        return self._apply_template(messages, tools, kwargs, add_generation_prompt=True)

    @property
    def content_format(self) -> ContentFormat:
        if self._content_format is None:
            template = getattr(self.tokenizer, "chat_template", None)
            self._content_format = detect_content_format(template)
        return self._content_format

    @staticmethod
    def _normalization(completion: CompletionRecord) -> ServerNormalization:
        try:
            return profile_named(completion.normalization)
        except ValueError as err:
            raise SampleError("bad_normalization", str(err)) from None

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
        for profile in reversed(PROFILES):
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

    def _kwargs(self, completion: CompletionRecord) -> dict[str, Any]:
        """The template kwargs the server rendered the prompt with (the record's sampling
        says), over the family's defaults; the builder's own kwargs win."""
        sent = (completion.sampling or {}).get("chat_template_kwargs")
        sent = sent if isinstance(sent, Mapping) else {}
        return {**self._default_kwargs, **sent, **self._explicit_kwargs}

    # -- rendering ------------------------------------------------------------------------

    def _prepare(self, message: Message) -> Message:
        """The generated turn (rendered by the family's format, not the template): Qwen's
        prints tool-call arguments as a mapping, so the JSON string is decoded."""
        calls = message.get("tool_calls")
        if self.profile.name != "qwen3" or not calls:
            return message
        return {**message, "tool_calls": [_decoded_arguments(call) for call in calls]}

    def _apply_template(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        kwargs: Mapping[str, Any],
        *,
        add_generation_prompt: bool,
    ) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )
        except Exception as err:  # jinja errors, raise_exception(), bad message shapes
            raise SampleError("template_error", f"{type(err).__name__}: {err}") from None
        if not isinstance(text, str):
            raise SampleError("template_error", f"template returned {type(text).__name__}")
        return text

    def _template_turn(
        self,
        messages: list[Message],
        generated: Message,
        tools: list[dict[str, Any]] | None,
        kwargs: Mapping[str, Any],
        prompt: str,
    ) -> str:
        """Unknown family: the template's rendering of the finished conversation past the
        prompt (the generation prompt must reappear verbatim, else the turn is unknowable)."""
        bare = self._apply_template(messages, tools, kwargs, add_generation_prompt=False)
        full = self._apply_template(
            [*messages, generated], tools, kwargs, add_generation_prompt=False
        )
        if not (prompt.startswith(bare) and full.startswith(prompt)):
            raise SampleError(
                "prefix_mismatch", "the rendered conversation does not extend the prompt"
            )
        return full[len(prompt) :]

    # -- tokens ---------------------------------------------------------------------------

    def _encode(
        self,
        rendered: Mapping[int, RenderedText | SampleError],
        encode_batch: Callable[[Sequence[str]], list[list[int]]],
    ) -> dict[int, tuple[Ids, int] | SampleError]:
        """(ids, prompt length) per rendered completion, from one batch encode: the prompt and
        the turn encoded separately, as the server encodes the prompt and the model samples."""
        pieces = {
            i: [item.prompt, item.turn]
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
            if batch is not None:
                prompt_ids, turn_ids = batch[position : position + 2]
                position += 2
            else:
                try:
                    prompt_ids, turn_ids = encode_batch(pieces[i])
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as err:
                    out[i] = SampleError("encode_error", f"{type(err).__name__}: {err}")
                    continue
            ids = np.array(prompt_ids + turn_ids, dtype=np.int32)
            out[i] = (ids, len(prompt_ids))
        return out

    def _confirm_drift(
        self,
        servers: Mapping[int, tuple[Ids, Ids] | None],
        rendered: Mapping[int, RenderedText | SampleError],
        encoded: Mapping[int, tuple[Ids, int] | SampleError],
        assembled: dict[int, Sample | SampleError],
    ) -> None:
        """A drift measured with the twin's ids is re-measured with the tokenizer's own, so
        that a drift is the tokenizer's, never the twin's (encoder.py)."""
        drifted = {
            i: rendered[i]
            for i, sample in assembled.items()
            if isinstance(sample, Sample) and sample.drift
        }
        if not drifted:
            return
        for i, confirmed in self._encode(drifted, self.encoder.reference).items():
            if _same_encoding(confirmed, encoded[i]):
                continue
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
                sample.drift_position = _first_difference(rendered[0], server_all)
                sample.drift_cause = self._drift_cause(server, rendered)
        return sample

    def _drift_cause(self, server: tuple[Ids, Ids], rendered: tuple[Ids, int]) -> DriftCause:
        """Only for drifted samples: two single-token decodes, no pass over the whole sample."""
        ids, prompt_len = rendered
        side: Literal["prompt", "turn"] = "prompt"
        ours, theirs, offset = ids[:prompt_len], server[0], 0
        if np.array_equal(ours, theirs):
            side, ours, theirs, offset = "turn", ids[prompt_len:], server[1], prompt_len
        at = _first_difference(ours, theirs)
        server_token = int(theirs[at]) if at < len(theirs) else None
        rendered_token = int(ours[at]) if at < len(ours) else None
        server_text, rendered_text = (
            self._token_text(server_token),
            self._token_text(rendered_token),
        )
        if server_text is not None and server_text == rendered_text:
            # two ids of the same text (two byte pieces shown as '\ufffd'): tell them apart
            server_text += f" #{server_token}"
            rendered_text = f"{rendered_text} #{rendered_token}"
        return DriftCause(side, offset + at, server_text, rendered_text)

    def _token_text(self, token: int | None) -> str | None:
        if token is None:
            return None
        try:
            text = repr(self.tokenizer.decode([token]))
        except Exception:  # a decode failure must not cost the sample; the id still says it
            return f"#{token}"
        if len(text) > CAUSE_TOKEN_CHARS:
            text = text[: CAUSE_TOKEN_CHARS - 1] + "…"
        return text

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


# -- family formats of the generated turn --------------------------------------------------


def _turn_parts(generated: Message, completion: CompletionRecord) -> tuple[str | None, str, bool]:
    """(reasoning, content, finished): `finished` is False for a length-truncated output,
    which has no end-of-turn token (and no think close if it stopped inside the reasoning)."""
    reasoning = generated.get("reasoning_content")
    content = generated.get("content") or ""
    if not isinstance(content, str):
        raise SampleError("bad_message", "generated content is not a string")
    if reasoning is not None and not isinstance(reasoning, str):
        raise SampleError("bad_message", "reasoning_content is not a string")
    return reasoning, content, completion.finish_reason != "length"


def _in_reasoning(content: str, generated: Message, finished: bool) -> bool:
    """Truncated before the think block closed: nothing after the reasoning was written."""
    return not finished and not content and not generated.get("tool_calls")


def _kimi_turn(
    generated: Message,
    profile: FamilyProfile,
    completion: CompletionRecord,
    calls_before: int,
    thinking: bool = True,
) -> str:
    """`{reasoning}</think>{content}<|tool_calls_section_begin|>…<|im_end|>` (K2.5/K2.6);
    with thinking off the prompt closed the think block: `{content}…<|im_end|>`."""
    reasoning, content, finished = _turn_parts(generated, completion)
    head = "" if profile.prefills_think else profile.think_open
    if not thinking:
        # a parser that forced reasoning on it put the model's text in the reasoning
        text = (reasoning or "") + content
    elif _in_reasoning(content, generated, finished):
        return head + (reasoning or "")
    else:
        text = head + (reasoning or "") + profile.think_close + content
    calls = generated.get("tool_calls") or []
    if calls:
        text += "<|tool_calls_section_begin|>"
        for index, call in enumerate(calls, start=calls_before):
            function = _function(call)
            arguments = function.get("arguments", "")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False)
            text += (
                f"<|tool_call_begin|>{_kimi_call_id(call, function, index)}"
                f"<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"
            )
        text += "<|tool_calls_section_end|>"
    return text + (profile.end_of_turn if finished else "")


def _kimi_call_id(call: Mapping[str, Any], function: Mapping[str, Any], index: int) -> str:
    """The id as given, as the K2.5/K2.6 template prints it (SGLang's parser gives every call
    one); a call without an id gets `functions.{name}:{index}`, as normalization gives them."""
    given = call.get("id")
    if isinstance(given, str) and given:
        return given
    return f"functions.{function.get('name', '')}:{index}"


def _qwen_turn(
    generated: Message, profile: FamilyProfile, completion: CompletionRecord, thinking: bool = True
) -> str:
    """`{reasoning}\\n</think>\\n\\n{content}<tool_call>…<|im_end|>`; with thinking off the
    prompt closed the think block: `{content}<tool_call>…<|im_end|>`, as written.

    SGLang's reasoning parser splits the output at `</think>` and strips nothing, so its
    content starts with the newlines the model wrote after `</think>` and its reasoning ends
    with the one before: such a turn is the model's text verbatim (whitespace, an empty or
    absent reasoning, `</think>` in the content, all as written). A trimmed record (older
    servers strip, datasets) gets the template's separators and trimming instead.
    """
    reasoning, content, finished = _turn_parts(generated, completion)
    head = "" if profile.prefills_think else profile.think_open + "\n"
    close = profile.think_close
    verbatim = content.startswith("\n")
    if not thinking:
        # a parser that forced reasoning on it put the model's text in the reasoning
        content = (reasoning or "") + content
        # the separator before a tool call is in the content unless a server trimmed it
        verbatim = content.endswith("\n")
        text = content
    elif _in_reasoning(content, generated, finished):
        return head + (reasoning or "")
    elif verbatim:
        text = head + (reasoning or "") + close + content
    else:
        content = content.strip()
        if reasoning is None and close in content:
            # the template splits an inline think block out of the content
            parts = content.split(close)
            reasoning = parts[0].split(profile.think_open)[-1]
            content = parts[-1].lstrip("\n")
        text = head + (reasoning or "").strip() + f"\n{close}\n\n" + content
    for position, call in enumerate(generated.get("tool_calls") or []):
        function = _function(call)
        if position:
            text += "\n"
        elif content.strip() and not verbatim:  # a verbatim content holds its separator
            text += "\n\n"
        text += f"<tool_call>\n<function={function.get('name', '')}>\n"
        arguments = function.get("arguments") or {}
        for name, value in arguments.items():
            value_text = _qwen_value(value, profile.tool_args_json)
            text += f"<parameter={name}>\n{value_text}\n</parameter>\n"
        text += "</function>\n</tool_call>"
    return text + (profile.end_of_turn if finished else "")


def _qwen_value(value: Any, as_json: bool) -> str:
    """As the template prints an argument: a string as is; anything else as JSON (Qwen3.6's
    `tojson`: `true`, `null`, `3`), or with Qwen3.5's `| string` (Python's str(): `True`,
    `None`) unless it is a mapping or a list."""
    if isinstance(value, str):
        return value
    if as_json or isinstance(value, Mapping | list | tuple):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


# -- helpers -------------------------------------------------------------------------------


def _function(call: Mapping[str, Any]) -> Mapping[str, Any]:
    function = call.get("function", call)
    if not isinstance(function, Mapping):
        raise SampleError("bad_tool_call", f"tool call without a function: {call!r:.200}")
    return function


def _decoded_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    function = _function(call)
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as err:
            raise SampleError("bad_tool_arguments", f"arguments are not JSON: {err}") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise SampleError("bad_tool_arguments", "arguments are not a JSON object")
    decoded = {**function, "arguments": dict(arguments)}
    return {**call, "function": decoded} if "function" in call else decoded


def _count_calls(messages: Iterable[Message]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")


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


def _first_difference(a: Ids, b: Ids) -> int:
    common = min(len(a), len(b))
    differ = np.flatnonzero(a[:common] != b[:common])
    return int(differ[0]) if differ.size else common
