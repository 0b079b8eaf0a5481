"""What vLLM's chat endpoint does to a request before the chat template, per released version.

vLLM validates the request with its pydantic models, rebuilds every message for the template
(`_parse_chat_message_content` and `_postprocess_messages`, in `entrypoints/chat_utils.py`
up to 0.32, `renderers/chat_utils/chat_message.py` from 0.33) and hands the template
`[tool.model_dump() for tool in request.tools]` (`serving_chat.py`, from 0.15
`chat_completion/serving.py`, from 0.22 `renderers/online_renderer.py`). Read in the released
`vllm` wheels 0.9.2, 0.10.2, 0.11.0, 0.12.0, 0.13.0, 0.15.0 to 0.22.0, 0.25.0, 0.28.0 to
0.34.0 (`pip download --no-deps vllm==X`); what every version does:

- tools: the whole tool, `{"type": "function", "function": {"name", "description",
  "parameters", ...}}`, with `description`/`parameters` the caller left out as null; all of
  them for a named `tool_choice` and for `"none"` (a server flag, off by default, drops them
  for `"none"`). Unknown keys are kept after the declared ones up to 0.27 (`strict` is one
  before 0.25); from 0.21/0.25 `defer_loading`/`strict` are declared and left out when unset;
  from 0.28 keys the models do not declare are dropped.
- messages: rebuilt as `role`, `content`, then an assistant's `tool_calls` as validated
  (`id`, `function` {`arguments`, `name`}, `type`, then unknown keys such as `index`), a tool
  message's `tool_call_id`, and any role's `name` (a user's too). Content is a list of text
  parts (`None` → none): `"openai"` format keeps them as `{"type": "text", "text"}` dicts (a
  plain string becomes one such part), `"string"` joins their texts with "\\n". Assistant
  tool-call `arguments` are parsed into objects, an empty one as `{}`.
- `chat_template_kwargs` go to the template as keywords (vLLM passes on only those the template
  or the tokenizer takes, which renders the same).

What changed between versions is each profile's docstring line below; a profile covers the
versions from its `since` up to the next one's.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from streams.core.serving.base import ContentFormat, NormalizationError
from streams.core.serving.vllm_format import detect_vllm_content_format

# the text part types vLLM reads as text, and the field holding their text
_TEXT_FIELDS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
_MEDIA = {"image_url": "image", "input_image": "image", "audio_url": "audio", "video_url": "video"}
_FUNCTION_FIELDS = ("name", "description", "parameters")


@dataclass(frozen=True)
class VllmNormalization:
    """One vLLM version range's request preprocessing."""

    name: str
    # the first vLLM version it describes
    since: tuple[int, ...]
    # an assistant's reasoning reaches the template as `reasoning` and `reasoning_content`
    # (0.12; before, history reasoning is dropped); an empty `tool_calls` list is dropped (0.13)
    history_reasoning: bool
    # a tool message's text parts joined with "\n" whatever the content format (0.20)
    join_tool_text: bool
    # `reasoning_effort` passed to the template when the request sets it (0.18), and
    # `enable_thinking` derived from it unless the kwargs set it (0.22)
    effort_kwarg: bool
    effort_enables_thinking: bool
    # `strict`/`defer_loading` declared and left out when unset (0.21/0.25, modelled from 0.22)
    declared_tool_fields: bool
    # keys the tool models do not declare are kept (before 0.28)
    tool_extras: bool
    # arguments that are not JSON, or not an object, become {} instead of a 400 (0.29)
    lenient_arguments: bool
    # the content-format detector's generation: 0 up to 0.21; 1 (0.22) counts loops over a
    # variable named `content`; 2 (0.30) follows macros called with message content; 3 (0.33)
    # follows `namespace` aliases of `messages`
    detector: int

    kind = "vllm"

    def template_content_format(self, template: str | None) -> ContentFormat:
        """vLLM's `--chat-template-content-format auto`: "openai" when the template loops
        over a message's content (`_detect_content_format`), else "string"."""
        return detect_vllm_content_format(template, self.detector)

    def tools(self, tools: Any, tool_choice: Any = "auto") -> list[dict[str, Any]] | None:
        """The `tools` the template gets: every tool, whatever `tool_choice` says."""
        if not tools:
            return None
        if not isinstance(tools, list):
            raise NormalizationError("tools must be a list")
        return [self._tool(tool) for tool in tools]

    def _tool(self, tool: Any) -> dict[str, Any]:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise NormalizationError("each tool needs a function with a name")
        dumped: dict[str, Any] = {k: copy.deepcopy(function.get(k)) for k in _FUNCTION_FIELDS}
        wrapper_defer = tool.get("defer_loading")
        declared = ("strict", "defer_loading") if self.declared_tool_fields else ()
        if self.declared_tool_fields:
            if function.get("strict") is not None:
                dumped["strict"] = function["strict"]
            defer = function.get("defer_loading")
            defer = wrapper_defer if defer is None else defer
            if defer is not None:
                dumped["defer_loading"] = defer
        if self.tool_extras:
            known = (*_FUNCTION_FIELDS, *declared)
            dumped.update({k: copy.deepcopy(v) for k, v in function.items() if k not in known})
        wrapper: dict[str, Any] = {"type": "function", "function": dumped}
        if self.declared_tool_fields and wrapper_defer is not None:
            wrapper["defer_loading"] = wrapper_defer
        if self.tool_extras:
            known = ("type", "function", *declared)
            wrapper.update({k: copy.deepcopy(v) for k, v in tool.items() if k not in known})
        return wrapper

    def messages(
        self, messages: Any, content_format: ContentFormat = "string"
    ) -> list[dict[str, Any]]:
        """The `messages` the template gets (the conversation vLLM builds)."""
        if not isinstance(messages, list):
            raise NormalizationError("messages must be a list")
        rebuilt = [self._message(m, content_format) for m in messages]
        for message in rebuilt:
            if message["role"] == "assistant" and isinstance(message.get("tool_calls"), list):
                self._parse_calls(message)
        return rebuilt

    def _message(self, message: Any, content_format: ContentFormat) -> dict[str, Any]:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise NormalizationError("each message needs a role")
        role = message["role"]
        out: dict[str, Any] = {"role": role, "content": _content(message, content_format)}
        if role == "assistant":
            if message.get("tool_calls") is not None:
                out["tool_calls"] = _tool_calls(message["tool_calls"])
            reasoning = message.get("reasoning")
            if reasoning is None:
                reasoning = message.get("reasoning_content")
            if self.history_reasoning and reasoning is not None:
                out["reasoning"] = reasoning
                out["reasoning_content"] = reasoning
        elif role == "tool":
            if "tool_call_id" in message:
                out["tool_call_id"] = message["tool_call_id"]
            if self.join_tool_text and isinstance(out["content"], list):
                parts = out["content"]
                if not any(isinstance(p, dict) and p.get("type") != "text" for p in parts):
                    out["content"] = "\n".join(p.get("text", "") for p in parts)
        if isinstance(message.get("name"), str):
            out["name"] = message["name"]
        return out

    def _parse_calls(self, message: dict[str, Any]) -> None:
        """`_postprocess_messages`: each call's arguments as an object."""
        calls = message["tool_calls"]
        if not calls and self.history_reasoning:
            del message["tool_calls"]
            return
        for call in calls:
            function = call.get("function")
            if not isinstance(function, dict):
                raise NormalizationError("a tool call needs a function")
            arguments = function.get("arguments")
            if not arguments:
                function["arguments"] = {}
            elif isinstance(arguments, str):
                function["arguments"] = self._parsed(arguments)

    def _parsed(self, arguments: str) -> Any:
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            if self.lenient_arguments:
                return {}
            raise NormalizationError("tool call arguments are not valid JSON") from None
        if self.lenient_arguments and not isinstance(parsed, dict):
            return {}
        return parsed

    def template_kwargs(
        self, chat_template_kwargs: Mapping[str, Any] | None, reasoning_effort: Any = None
    ) -> dict[str, Any]:
        """The keywords the template gets besides messages, tools and the generation prompt."""
        kwargs = dict(chat_template_kwargs or {})
        if self.effort_kwarg and reasoning_effort is not None:
            if self.effort_enables_thinking and "enable_thinking" not in kwargs:
                kwargs["enable_thinking"] = reasoning_effort != "none"
            kwargs["reasoning_effort"] = reasoning_effort
        return kwargs

    def prepare(
        self,
        messages: Any,
        tools: Any,
        *,
        tool_choice: Any = "auto",
        content_format: ContentFormat = "string",
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """(messages, tools) as the template gets them."""
        return self.messages(messages, content_format), self.tools(tools, tool_choice)


def _content(message: Mapping[str, Any], content_format: ContentFormat) -> Any:
    """`_parse_chat_message_content_parts` for text (draftgen has no media: a media part
    becomes the bare `{"type": ...}` of the "openai" format and nothing in "string")."""
    content = message.get("content")
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        parts = content
    else:
        raise NormalizationError("content must be a string or a list of parts")
    out: list[Any] = []
    for part in parts:
        if isinstance(part, str):
            out.append({"type": "text", "text": part} if content_format == "openai" else part)
            continue
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _TEXT_FIELDS:
            text = part.get(_TEXT_FIELDS[kind])
            if text is None:
                continue  # vLLM skips a text part without text
            out.append({"type": "text", "text": text} if content_format == "openai" else text)
        elif kind in _MEDIA and content_format == "openai":
            out.append({"type": _MEDIA[kind]})
    if content_format == "openai":
        return out
    return "\n".join(out)


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    """Each call as vLLM's request model validates it: `id`, `function` {`arguments`,
    `name`}, `type`, then the keys it does not declare (e.g. `index`), present keys only."""
    if not isinstance(calls, list):
        raise NormalizationError("tool_calls must be a list")
    out = []
    for call in calls:
        if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
            raise NormalizationError("a tool call needs a function")
        function = call["function"]
        dumped_function = {
            k: copy.deepcopy(function[k]) for k in ("arguments", "name") if k in function
        }
        dumped_function.update(
            {k: copy.deepcopy(v) for k, v in function.items() if k not in ("arguments", "name")}
        )
        dumped: dict[str, Any] = {}
        for key in ("id", "function", "type"):
            if key == "function":
                dumped["function"] = dumped_function
            elif key in call:
                dumped[key] = call[key]
        dumped.update(
            {k: copy.deepcopy(v) for k, v in call.items() if k not in ("id", "function", "type")}
        )
        out.append(dumped)
    return out


# Newest last; each describes versions from its `since` up to the next one's. Fields: name,
# since, history_reasoning, join_tool_text, effort_kwarg, effort_enables_thinking,
# declared_tool_fields, tool_extras, lenient_arguments, detector. What each adds, and where:
# - vllm-0.11 (before 0.12; read in 0.11.0, 0.10.2, 0.9.2): history reasoning dropped; an empty
#   `arguments` is {} (0.10 and older refuse it), others parsed, a non-JSON one a 400.
# - vllm-0.12 (0.12 to 0.19; 0.12.0, 0.13.0, 0.15.0 to 0.19.0): history reasoning as
#   `reasoning` and `reasoning_content`; an empty `tool_calls` list dropped (from 0.13).
# - vllm-0.20 (0.20, 0.21; 0.20.0, 0.21.0): a tool message's text parts joined with "\n";
#   `reasoning_effort` to the template when set (from 0.18).
# - vllm-0.22 (0.22 to 0.28; 0.22.0, 0.25.0, 0.28.0): the detector counts loops over
#   `content`; `enable_thinking` from `reasoning_effort`; `defer_loading`/`strict` declared.
# - vllm-0.29 (0.29; 0.29.0): bad or non-object `arguments` become {}; unknown tool keys
#   dropped (from 0.28).
# - vllm-0.30 (0.30 to 0.32; 0.30.0, 0.31.0, 0.32.0): the detector follows macros.
# - vllm-0.33 (0.33 and later; 0.33.0, 0.34.0; chat_utils moved to renderers/chat_utils/):
#   the detector follows `namespace` aliases.
VLLM_PROFILES: tuple[VllmNormalization, ...] = (
    VllmNormalization("vllm-0.11", (0,), False, False, False, False, False, True, False, 0),
    VllmNormalization("vllm-0.12", (0, 12), True, False, False, False, False, True, False, 0),
    VllmNormalization("vllm-0.20", (0, 20), True, True, True, False, False, True, False, 0),
    VllmNormalization("vllm-0.22", (0, 22), True, True, True, True, True, True, False, 1),
    VllmNormalization("vllm-0.29", (0, 29), True, True, True, True, True, False, True, 1),
    VllmNormalization("vllm-0.30", (0, 30), True, True, True, True, True, False, True, 2),
    VllmNormalization("vllm-0.33", (0, 33), True, True, True, True, True, False, True, 3),
)
