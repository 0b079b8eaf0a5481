"""A completion rendered as text: the prompt by the target's chat template, as the server
(SGLang or vLLM) of the completion's version renders it, and the generated turn in the
family's own format (streams/core/families/), or by the template for a family without one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from streams.core.families import FamilyProfile, FormatError
from streams.core.records import CompletionRecord, Message
from streams.core.serving import (
    ContentFormat,
    NormalizationError,
    ServerNormalization,
    profile_named,
)
from streams.tokenize.sample_types import SampleError


@dataclass
class RenderedText:
    """A completion rendered as text: the prompt (ending with the generation prompt) and the
    generated turn (exactly the supervised text)."""

    prompt: str
    turn: str


class Renderer:
    """Renders completions for one tokenizer and model family; stateless between calls."""

    def __init__(
        self,
        tokenizer: Any,
        profile: FamilyProfile,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.profile = profile
        # Every kwarg explicit: Kimi's remote code defaults add_generation_prompt=True.
        self._default_kwargs = profile.template_kwargs(thinking=True)
        self._explicit_kwargs = dict(template_kwargs or {})

    def render(
        self, completion: CompletionRecord, normalization: ServerNormalization | None = None
    ) -> RenderedText:
        """The prompt text (ending with the generation prompt) and the generated turn's text,
        the prompt as the server of the completion's profile (or `normalization`) renders it."""
        if normalization is None:
            normalization = self._normalization(completion)
        try:
            messages, tools = normalization.prepare(
                completion.messages,
                completion.tools,
                content_format=self.content_format(normalization),
            )
        except NormalizationError as err:  # the server would have refused it
            raise SampleError("bad_tool_arguments", str(err)) from None
        profile = self.profile
        try:
            generated = profile.prepare_turn(completion.generated_message())
        except FormatError as err:
            raise SampleError(err.kind, err.message) from None
        kwargs = normalization.template_kwargs(self._kwargs(completion))
        # a run with thinking off (`--no-thinking`): the prompt closes the think block itself
        thinking = not (profile.thinking_kwarg and kwargs.get(profile.thinking_kwarg) is False)
        prompt = self._apply_template(messages, tools, kwargs, add_generation_prompt=True)
        try:
            turn = profile.render_turn(
                generated,
                finished=completion.finish_reason != "length",
                calls_before=_count_calls(messages),
                thinking=thinking,
            )
        except FormatError as err:
            raise SampleError(err.kind, err.message) from None
        if turn is None:  # no format of its own: the template renders the turn
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
                completion.messages,
                completion.tools,
                content_format=self.content_format(normalization),
            )
        except NormalizationError as err:
            raise SampleError("bad_tool_arguments", str(err)) from None
        kwargs = normalization.template_kwargs(self._kwargs(completion))
        return self._apply_template(messages, tools, kwargs, add_generation_prompt=True)

    def content_format(self, normalization: ServerNormalization) -> ContentFormat:
        """How the server of `normalization` flattens list content for this template."""
        return normalization.template_content_format(getattr(self.tokenizer, "chat_template", None))

    @staticmethod
    def _normalization(completion: CompletionRecord) -> ServerNormalization:
        try:
            return profile_named(completion.normalization)
        except ValueError as err:
            raise SampleError("bad_normalization", str(err)) from None

    def _kwargs(self, completion: CompletionRecord) -> dict[str, Any]:
        """The template kwargs the server rendered the prompt with (the record's sampling
        says), over the family's defaults; the builder's own kwargs win."""
        sent = (completion.sampling or {}).get("chat_template_kwargs")
        sent = sent if isinstance(sent, Mapping) else {}
        return {**self._default_kwargs, **sent, **self._explicit_kwargs}

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


def _count_calls(messages: Iterable[Message]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
