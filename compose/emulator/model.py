"""The emulated model's tokenizer side: chat-template rendering, encode/decode, special ids."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from streams.core.families import FamilyProfile, detect_family
from streams.core.serving import ContentFormat, detect_content_format

# Outputs whose text is kept: a scripted pool repeats them (decoding is most of a scripted
# request's cost otherwise); generated outputs are all different and just pass through.
DECODED_KEPT = 1024


class TemplateError(ValueError):
    """The chat template refused the conversation (a bad request, not a server fault)."""


@dataclass(frozen=True)
class SpecialIds:
    eot: int | None
    think_open: int | None
    think_close: int | None


class EmulatedModel:
    """Loads the tokenizer the way SGLang does and renders prompts with its chat template."""

    def __init__(self, tokenizer_dir: Path, family: str | None = None) -> None:
        self.tokenizer_dir = tokenizer_dir
        self._decoded: dict[tuple[tuple[int, ...], bool], str] = {}
        self.tokenizer: Any = AutoTokenizer.from_pretrained(
            str(tokenizer_dir), trust_remote_code=True
        )
        self.family: FamilyProfile = detect_family(tokenizer_dir, family)
        self.special = SpecialIds(
            eot=self._single_id(self.family.end_of_turn) if self.family.end_of_turn else None,
            think_open=self._single_id(self.family.think_open),
            think_close=self._single_id(self.family.think_close),
        )
        if self.special.eot is None:
            eos = getattr(self.tokenizer, "eos_token_id", None)
            self.special = SpecialIds(eos, self.special.think_open, self.special.think_close)
        # added and special tokens are never split when emulating drift
        self.unsplittable: frozenset[int] = frozenset(
            {int(i) for i in self.tokenizer.get_added_vocab().values()}
            | {int(i) for i in self.tokenizer.all_special_ids}
        )
        self.vocab_size = len(self.tokenizer)
        self.chat_template: str | None = getattr(self.tokenizer, "chat_template", None)
        # how SGLang flattens list content for this template (the engine asks its profile)
        self.content_format: ContentFormat = detect_content_format(self.chat_template)

    def _single_id(self, token: str) -> int | None:
        """The id of a token that encodes to exactly one id, else None."""
        ids = self.encode(token)
        return ids[0] if len(ids) == 1 else None

    # -- text <-> ids -----------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def decode_output(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """An output's text for the response, kept for the outputs that come again."""
        key = (tuple(ids), skip_special_tokens)
        text = self._decoded.get(key)
        if text is None:
            text = self.decode(ids, skip_special_tokens)
            if len(self._decoded) >= DECODED_KEPT:
                self._decoded.pop(next(iter(self._decoded)))  # the oldest
            self._decoded[key] = text
        return text

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id], skip_special_tokens=False)

    # -- prompts ----------------------------------------------------------------------------

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        continue_final_message: bool = False,
    ) -> str:
        """The prompt text, as SGLang's jinja path renders it (generation prompt explicit)."""
        kwargs = dict(template_kwargs or {})
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                add_generation_prompt=not continue_final_message,
                continue_final_message=continue_final_message,
                tokenize=False,
                **kwargs,
            )
        except Exception as exc:  # jinja errors, raise_exception(), bad roles
            raise TemplateError(f"chat template failed: {exc}") from exc
        if not isinstance(text, str):
            raise TemplateError("chat template did not render a string")
        return text
