"""What SGLang's chat endpoint does to a request before the chat template, per server version.

SGLang does not hand the template the request as sent: it validates it with pydantic models and
renders their dumps (`serving_chat._apply_jinja_template`, `protocol.py`). A prompt rendered
any other way is another prompt: the drift check, the rendered path and `--api native` must
render what the server renders. What changed between versions (read in the released `sglang`
wheels 0.5.1 and 0.5.3 to 0.5.12, and for the later changes 0.5.15, 0.5.18, 0.5.21 to 0.5.23):

- tools: up to 0.5.8 `[tool.function.model_dump()]`, the function alone with `"strict": false`
  added; from 0.5.9 `[tool.model_dump()]`, the `{"type", "function"}` wrapper, which from
  0.5.11 ends with `"defer_loading": null`; from 0.5.23 the function keeps the caller's key
  order and gains no `strict` the caller left out (`Function.key_order`). Only the named
  function for a named `tool_choice`; none for `"none"`.
- messages: every version renders `msg.model_dump()` with `None` fields left out, `None`
  content as `""`; a user message keeps only role and content. From 0.5.4 assistant tool-call
  `arguments` strings are parsed into objects. List content is flattened by the template's
  content format: `"string"` joins the text parts with a space, `"openai"` keeps text parts
  (`detect_content_format`); from 0.5.11 a tool message's text parts are joined with a space.
  0.5.22 and later refuse arguments that are JSON but not an object (checked here from 0.5.23).
- `reasoning_effort` goes to the template as a keyword: always up to 0.5.9 (default
  "medium"), only when the request sets it from 0.5.10; `chat_template_kwargs` as keywords.

A profile is chosen from the version the server reports (`/server_info`'s `version`), the newest
by default (streams/core/serving/__init__.py). The emulator prepares requests with the same
code, so the tests see what a real server does.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.nodes as nodes
import orjson

from streams.core.serving.base import ContentFormat, NormalizationError


@dataclass(frozen=True)
class SglangNormalization:
    """One SGLang version range's request preprocessing."""

    name: str
    # the first server version it describes
    since: tuple[int, ...]
    # tools as `tool.model_dump()` (the wrapper, 0.5.9) or `tool.function.model_dump()`
    wrapped_tools: bool
    # the function keeps the caller's key order and adds no `strict` (0.5.23)
    caller_key_order: bool
    # assistant tool-call arguments parsed from JSON text into objects (0.5.4)
    parse_arguments: bool
    # the reasoning_effort keyword when the request has none ("medium" up to 0.5.9)
    default_reasoning_effort: str | None
    # a tool message's text parts joined with a space (normalize_tool_content, 0.5.11)
    join_tool_text: bool
    # the tool dump carries `defer_loading` (null unless set; 0.5.11)
    defer_loading: bool

    kind = "sglang"

    def template_content_format(self, template: str | None) -> ContentFormat:
        """How list content is flattened for this chat template (`detect_content_format`)."""
        return detect_content_format(template)

    def tools(self, tools: Any, tool_choice: Any = "auto") -> list[dict[str, Any]] | None:
        """The `tools` the template gets."""
        if not tools or tool_choice == "none":
            return None
        if not isinstance(tools, list):
            raise NormalizationError("tools must be a list")
        out = []
        for tool in tools:
            function = tool.get("function") if isinstance(tool, Mapping) else None
            if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
                raise NormalizationError("each tool needs a function with a name")
            if isinstance(tool_choice, Mapping):
                wanted = (tool_choice.get("function") or {}).get("name")
                if function["name"] != wanted:
                    continue
            out.append(self._tool(tool, function))
        return out or None

    def _tool(self, tool: Mapping[str, Any], function: Mapping[str, Any]) -> dict[str, Any]:
        if not self.wrapped_tools:
            return {
                "description": function.get("description"),
                "name": function["name"],
                "parameters": function.get("parameters"),
                "strict": bool(function.get("strict") or False),
            }
        tool_defer = tool.get("defer_loading")
        if not self.caller_key_order:
            dumped = {
                "description": function.get("description"),
                "name": function["name"],
                "parameters": function.get("parameters"),
                "strict": bool(function.get("strict") or False),
            }
            defer = function.get("defer_loading")
            defer = tool_defer if defer is None else defer
            if self.defer_loading and defer is not None:
                dumped["defer_loading"] = defer
        else:
            dumped = _function_in_caller_order(function, tool_defer)
        wrapper: dict[str, Any] = {"type": tool.get("type") or "function", "function": dumped}
        if self.defer_loading:
            wrapper["defer_loading"] = tool_defer
        return wrapper

    def messages(
        self, messages: Any, content_format: ContentFormat = "string"
    ) -> list[dict[str, Any]]:
        """The `messages` the template gets."""
        if not isinstance(messages, list):
            raise NormalizationError("messages must be a list")
        return [self._message(m, content_format) for m in messages]

    def _message(self, message: Any, content_format: ContentFormat) -> dict[str, Any]:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise NormalizationError("each message needs a role")
        role = message["role"].lower()
        dumped: dict[str, Any]
        if role == "user":
            dumped = {"role": role, "content": copy.deepcopy(message.get("content"))}
        else:
            dumped = {
                "role": role,
                "content": copy.deepcopy(message.get("content")),
                "tool_call_id": message.get("tool_call_id"),
                "name": message.get("name"),
                "reasoning_content": message.get("reasoning_content"),
                "tool_calls": _tool_calls(message.get("tool_calls")),
            }
        if self.parse_arguments and role == "assistant":
            for call in dumped.get("tool_calls") or []:
                function = call["function"]
                if isinstance(function.get("arguments"), str):
                    function["arguments"] = _parsed_arguments(
                        function["arguments"], objects_only=self.caller_key_order
                    )
        if dumped["content"] is None:
            dumped["content"] = ""
        content = dumped["content"]
        if isinstance(content, list):
            dumped["content"] = _flatten(content, content_format)
            if self.join_tool_text and role == "tool":
                dumped["content"] = _join_tool_text(dumped["content"])
        return {k: v for k, v in dumped.items() if v is not None}

    def template_kwargs(
        self, chat_template_kwargs: Mapping[str, Any] | None, reasoning_effort: Any = None
    ) -> dict[str, Any]:
        """The keywords the template gets besides messages, tools and the generation prompt."""
        kwargs: dict[str, Any] = {}
        effort = reasoning_effort
        if effort is None:
            effort = self.default_reasoning_effort
        if effort is not None:
            kwargs["reasoning_effort"] = effort
        kwargs.update(chat_template_kwargs or {})
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


def _function_in_caller_order(function: Mapping[str, Any], tool_defer: Any) -> dict[str, Any]:
    """0.5.23's `Function` dump: its fields, `strict` and `defer_loading` only when set, in the
    order the caller sent them; declared fields the caller left out follow (as None)."""
    defer = function.get("defer_loading")
    data: dict[str, Any] = {
        "description": function.get("description"),
        "name": function["name"],
        "parameters": function.get("parameters"),
        "strict": function.get("strict"),
        "defer_loading": tool_defer if defer is None else defer,
    }
    if data["defer_loading"] is None:
        del data["defer_loading"]
    if data["strict"] is None:
        del data["strict"]
    order = [k for k in function if k in data]
    return {k: data[k] for k in order + [k for k in data if k not in order]}


def _tool_calls(calls: Any) -> list[dict[str, Any]] | None:
    """`ToolCall.model_dump()` of each call: id, index, type, function{name, arguments}."""
    if calls is None:
        return None
    if not isinstance(calls, list):
        raise NormalizationError("tool_calls must be a list")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            raise NormalizationError("a tool call needs a function")
        out.append(
            {
                "id": call.get("id"),
                "index": call.get("index"),
                "type": "function",
                "function": {
                    "name": function.get("name"),
                    "arguments": copy.deepcopy(function.get("arguments")),
                },
            }
        )
    return out


def _parsed_arguments(arguments: str, objects_only: bool) -> Any:
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        raise NormalizationError(
            "Assistant tool call function.arguments must be valid JSON."
        ) from None
    if objects_only and not isinstance(parsed, dict):
        raise NormalizationError("Assistant tool call function.arguments must be a JSON object.")
    return parsed


def _flatten(parts: list[Any], content_format: ContentFormat) -> Any:
    """process_content_for_template_format for text (the emulator and draftgen have no media:
    an image or video part becomes the bare `{"type": ...}` SGLang leaves the template)."""
    if content_format == "string":
        texts = [
            p["text"]
            for p in parts
            if isinstance(p, Mapping) and p.get("type") in ("text", "input_text")
        ]
        return " ".join(texts)
    out: list[Any] = []
    for part in parts:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("text", "input_text"):
            out.append({"type": "text", "text": part["text"]})
        elif kind in ("image_url", "input_image"):
            out.append({"type": "image"})
        elif kind in ("video_url", "audio_url"):
            out.append({"type": kind.split("_")[0]})
    return out


def _join_tool_text(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    if all(
        (isinstance(p, Mapping) and p.get("type") == "text") or isinstance(p, str) for p in content
    ):
        return " ".join(p.get("text", "") if isinstance(p, Mapping) else p for p in content)
    return content


# -- the template's content format (sglang/srt/parser/jinja_template_utils.py) -------------


@functools.lru_cache(maxsize=32)
def detect_content_format(template: str | None) -> ContentFormat:
    """ "openai" when the template loops over a message's content (or mentions media), else
    "string", as SGLang decides how to flatten list content."""
    if not template:
        return "string"
    if any(word in template for word in ("image", "audio", "video", "vision")):
        return "openai"
    try:
        tree = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except Exception:
        return "string"
    for loop in tree.find_all(nodes.For):
        for name in ("message", "msg", "m"):
            if _iterates_content(loop.iter, name):
                return "openai"
    return "string"


def _iterates_content(node: Any, name: str) -> bool:
    if isinstance(node, nodes.Filter | nodes.Test):
        return node.node is not None and _iterates_content(node.node, name)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _iterates_content(node.node, name)
    if isinstance(node, nodes.Getitem):
        return (
            isinstance(node.node, nodes.Name)
            and node.node.name == name
            and isinstance(node.arg, nodes.Const)
            and node.arg.value == "content"
        )
    if isinstance(node, nodes.Getattr):
        return (
            isinstance(node.node, nodes.Name) and node.node.name == name and node.attr == "content"
        )
    return False


# Newest last; each describes versions from its `since` up to the next one's. Fields: name,
# since, wrapped_tools, caller_key_order, parse_arguments, default_reasoning_effort,
# join_tool_text, defer_loading.
SGLANG_PROFILES: tuple[SglangNormalization, ...] = (
    SglangNormalization("sglang-0.5.1", (0,), False, False, False, "medium", False, False),
    SglangNormalization("sglang-0.5.4", (0, 5, 4), False, False, True, "medium", False, False),
    SglangNormalization("sglang-0.5.9", (0, 5, 9), True, False, True, "medium", False, False),
    SglangNormalization("sglang-0.5.10", (0, 5, 10), True, False, True, None, False, False),
    SglangNormalization("sglang-0.5.11", (0, 5, 11), True, False, True, None, True, True),
    SglangNormalization("sglang-0.5.23", (0, 5, 23), True, True, True, None, True, True),
)
