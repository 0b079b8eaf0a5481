"""What a model family is: a profile (the facts the stages read) holding a format (the text the
family's model writes, and SGLang's parsing of it back).

One module per family (kimi_k2.py, qwen3.py, generic.py) builds its profile; the registry
(registry.py) detects it from a chat template or a model name. Facts: each family's module and
docs/templates.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

Message = dict[str, Any]  # as streams.core.records.Message (OpenAI chat format)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the OpenAI API carries it

    def to_openai(self, index: int) -> dict[str, Any]:
        return {
            "id": self.id,
            "index": index,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


class FormatError(ValueError):
    """A generated turn the family's format cannot print; `kind` names it for dead letters."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class TurnFormat:
    """A family's own text: the generated turn (tokenize), its tool calls (the emulator writes
    them, SGLang's parser reads them back), the think tags as the model writes them.

    The defaults are a family without a format of its own (`PlainFormat`): the chat template
    renders the turn, no tool calls, the profile's bare think tags. A family overrides what its
    model writes differently."""

    @property
    def tool_start(self) -> str | None:
        """The text that starts a tool-call section (ends reasoning); None: no tool calls."""
        return None

    def prepare(self, message: Message) -> Message:
        """The generated message as `turn` wants it (e.g. arguments decoded)."""
        return message

    def turn(
        self,
        profile: FamilyProfile,
        generated: Message,
        *,
        finished: bool,
        calls_before: int,
        thinking: bool,
    ) -> str | None:
        """The generated turn's text, exactly the supervised text; None: the family has no
        format of its own and the chat template renders the turn."""
        return None

    def parse_calls(
        self, text: str, tools: list[dict[str, Any]], history_calls: int
    ) -> tuple[str, list[ToolCall]]:
        """(normal text, calls) as the family's SGLang detector returns them."""
        return text, []

    def write_calls(self, calls: list[tuple[str, dict[str, Any]]], first_index: int) -> str:
        """The text the model writes for these (name, arguments) calls."""
        raise ValueError("this family has no tool-call format")

    def think_texts(self, profile: FamilyProfile) -> tuple[str, str]:
        """(open, close): the think tags with the whitespace the model writes around them."""
        return profile.think_open, profile.think_close


@dataclass(frozen=True)
class PlainFormat(TurnFormat):
    """No format of its own: the template renders the turn, no tool calls, bare think tags."""


@dataclass(frozen=True)
class FamilyProfile:
    name: str
    # chat_template_kwargs key that turns thinking on
    thinking_kwarg: str | None
    # token that ends an assistant turn (and is the stop token)
    end_of_turn: str
    think_open: str = "<think>"
    think_close: str = "</think>"
    # the generation prompt already ends with `<think>` (K2.5/K2.6, Qwen3.5/3.6)
    prefills_think: bool = False
    # the template accepts preserve_thinking=True (keeps history reasoning)
    preserve_thinking: bool = False
    # SGLang --reasoning-parser name
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    # Qwen tool-call arguments that are not strings print as JSON (`true`, `null`, `3`; Qwen3.6),
    # or with Python's str() unless a mapping or list (`True`, `None`; Qwen3.5's `| string`)
    tool_args_json: bool = True
    # the family's text (turn, tool calls, think tags)
    format: TurnFormat = field(default_factory=PlainFormat)
    # detection: a chat template holding all of these texts is this family's (none: never)
    template_markers: tuple[str, ...] = ()
    # detection: a served model name containing one of these (lowercase) is this family's
    model_markers: tuple[str, ...] = ()
    # members of the family whose templates differ in a way of the family's own: the profile
    # for a template (Qwen3.5's tool arguments); the shared facts are read by `for_template`
    refine: Callable[[FamilyProfile, str], FamilyProfile] | None = None

    def template_kwargs(self, thinking: bool = True) -> dict[str, Any]:
        return {self.thinking_kwarg: thinking} if self.thinking_kwarg else {}

    def matches_template(self, template: str) -> bool:
        markers = self.template_markers
        return bool(markers) and all(marker in template for marker in markers)

    def matches_model(self, model: str) -> bool:
        lowered = model.lower()
        return any(marker in lowered for marker in self.model_markers)

    def for_template(self, template: str) -> FamilyProfile:
        """The profile of the member of the family whose chat template this is: older members
        (K2-Thinking, Qwen3) do not prefill `<think>` nor take `preserve_thinking`; then the
        family's own rule (`refine`)."""
        if not template:
            return self
        # the generation-prompt block is the tail after `add_generation_prompt`
        index = template.rfind("add_generation_prompt")
        profile = replace(
            self,
            preserve_thinking="preserve_thinking" in template,
            prefills_think=index >= 0 and self.think_open in template[index:],
        )
        return profile.refine(profile, template) if profile.refine else profile

    # -- the format, for callers that hold the profile ----------------------------------------

    @property
    def tool_start(self) -> str | None:
        return self.format.tool_start

    def prepare_turn(self, message: Message) -> Message:
        return self.format.prepare(message)

    def render_turn(
        self, generated: Message, *, finished: bool, calls_before: int, thinking: bool
    ) -> str | None:
        return self.format.turn(
            self, generated, finished=finished, calls_before=calls_before, thinking=thinking
        )

    def parse_tool_calls(
        self, text: str, tools: list[dict[str, Any]], history_calls: int
    ) -> tuple[str, list[ToolCall]]:
        return self.format.parse_calls(text, tools, history_calls)

    def write_tool_calls(self, calls: list[tuple[str, dict[str, Any]]], first_index: int) -> str:
        return self.format.write_calls(calls, first_index)

    def think_texts(self) -> tuple[str, str]:
        return self.format.think_texts(self)


# -- helpers the family formats share -------------------------------------------------------


def turn_parts(generated: Message, finished: bool) -> tuple[str | None, str, bool]:
    """(reasoning, content, finished): `finished` is False for a length-truncated output,
    which has no end-of-turn token (and no think close if it stopped inside the reasoning)."""
    reasoning = generated.get("reasoning_content")
    content = generated.get("content") or ""
    if not isinstance(content, str):
        raise FormatError("bad_message", "generated content is not a string")
    if reasoning is not None and not isinstance(reasoning, str):
        raise FormatError("bad_message", "reasoning_content is not a string")
    return reasoning, content, finished


def in_reasoning(content: str, generated: Message, finished: bool) -> bool:
    """Truncated before the think block closed: nothing after the reasoning was written."""
    return not finished and not content and not generated.get("tool_calls")


def function_of(call: Mapping[str, Any]) -> Mapping[str, Any]:
    function = call.get("function", call)
    if not isinstance(function, Mapping):
        raise FormatError("bad_tool_call", f"tool call without a function: {call!r:.200}")
    return function
