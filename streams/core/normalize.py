"""Turn a source row into a canonical OpenAI-format prompt, and give it its stable `prompt_id`.

Accepted row shapes:

- OpenAI: ``{"messages": [{"role": ..., "content": ...}, ...], "tools": [...]}``
- ShareGPT: ``{"conversations": [{"from": "human", "value": ...}, ...], "tools": ...}``
  (``tools`` may be a JSON string, as in LLaMA-Factory's ShareGPT flavour).

Either may carry a top-level ``"system"`` string, which becomes a leading system message.

Failures raise `RecordError` whose `kind` is one of `ERROR_KINDS`, for dead letters.
"""

from __future__ import annotations

import hashlib
from collections import deque
from typing import Any

import orjson

from streams.core.records import Message, PromptRecord, RecordError

Tool = dict[str, Any]

ROLES = frozenset({"system", "user", "assistant", "tool"})

# Role names seen in the wild, mapped to OpenAI roles. `function_call` is an assistant turn whose
# value is the call itself (LLaMA-Factory); it is turned into `tool_calls`.
ROLE_ALIASES: dict[str, str] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "function_call": "assistant",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
}

# The only message keys that survive normalization; anything else (weights, masks, …) is dropped.
MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")

ERROR_KINDS = frozenset(
    {
        "bad_shape",  # not an object, no messages/conversations, wrong types
        "empty_messages",  # the conversation has no turns
        "unknown_role",  # a role outside ROLE_ALIASES
        "non_string_content",  # content that is not text (numbers, objects, images, …)
        "no_user_turn",  # nothing to answer
        "missing_tool_call_id",  # a tool result that answers no known call
        "bad_tool_call",  # an assistant tool call without function name / string arguments
        "ends_with_assistant",  # only from validate_prompt_messages: the answer is already there
        "bad_tools",  # a tool that is not an OpenAI function tool (validate_prompt_messages)
    }
)

# Joins the text parts of list-form content, as vLLM does for text-only multi-part messages.
_PART_SEPARATOR = "\n"


def normalize_conversation(raw: Any) -> tuple[list[Message], list[Tool] | None]:
    """Normalize a source row to (messages, tools) in canonical OpenAI chat form.

    Trailing assistant turns are dropped: the target model regenerates the answer. Tool calls
    keep their ids as given (templates print them verbatim); calls without ids get Kimi-style
    ids ``functions.{name}:{index}`` (index counts every tool call in the conversation), so the
    function name reaches models whose templates print only the id; tool results without
    `tool_call_id` answer the oldest unanswered call.
    """
    if not isinstance(raw, dict):
        raise RecordError("bad_shape", f"expected a JSON object, got {type(raw).__name__}")
    turns, system = _turns_of(raw)
    if not turns and not system:
        raise RecordError("empty_messages", "the conversation has no turns")
    messages: list[Message] = [{"role": "system", "content": system}] if system else []
    calls = _CallIds()
    for index, turn in enumerate(turns):
        messages.append(_normalize_turn(turn, index, calls))
    tools = normalize_tools(raw.get("tools"))
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    if not messages:
        raise RecordError("no_user_turn", "only assistant turns: nothing to answer")
    validate_prompt_messages(messages, tools)
    return messages, tools


def _turns_of(raw: dict[str, Any]) -> tuple[list[Any], str]:
    for key in ("messages", "conversations"):
        turns = raw.get(key)
        if turns is None:
            continue
        if not isinstance(turns, list):
            raise RecordError("bad_shape", f"{key!r} must be a list, got {type(turns).__name__}")
        system = raw.get("system")
        if system is not None and not isinstance(system, str):
            raise RecordError("non_string_content", "top-level 'system' must be a string")
        return turns, system or ""
    raise RecordError("bad_shape", "no 'messages' or 'conversations' field")


class _CallIds:
    """Hands out ids for id-less tool calls and matches id-less tool results to them."""

    def __init__(self) -> None:
        self.count = 0
        self.pending: deque[str] = deque()

    def called(self, name: str, given: Any) -> str:
        call_id = given if isinstance(given, str) and given else f"functions.{name}:{self.count}"
        self.count += 1
        self.pending.append(call_id)
        return call_id

    def answered(self, given: Any, index: int) -> str:
        if isinstance(given, str) and given:
            if given in self.pending:
                self.pending.remove(given)
            return given
        if not self.pending:
            raise RecordError(
                "missing_tool_call_id", f"turn {index}: tool result without a call to answer"
            )
        return self.pending.popleft()


def _normalize_turn(turn: Any, index: int, calls: _CallIds) -> Message:
    if not isinstance(turn, dict):
        raise RecordError("bad_shape", f"turn {index} is a {type(turn).__name__}, not an object")
    sharegpt = "from" in turn
    source_role = turn.get("from") if sharegpt else turn.get("role")
    alias = source_role.lower() if isinstance(source_role, str) else None
    role = ROLE_ALIASES.get(alias) if alias else None
    if role is None:
        raise RecordError("unknown_role", f"turn {index}: role {source_role!r}")
    raw_content = turn.get("value", turn.get("content")) if sharegpt else turn.get("content")

    if alias == "function_call":
        message: Message = {"role": "assistant", "content": ""}
        tool_calls: Any = _parse_function_call_value(raw_content, index)
    else:
        message = {"role": role, "content": _normalize_content(raw_content, role, index)}
        tool_calls = turn.get("tool_calls")

    name = turn.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise RecordError("bad_shape", f"turn {index}: 'name' must be a string")
        message["name"] = name
    if role == "assistant":
        reasoning = turn.get("reasoning_content", turn.get("reasoning"))
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise RecordError("non_string_content", f"turn {index}: reasoning is not text")
            if reasoning:
                message["reasoning_content"] = reasoning
        if tool_calls:  # None and [] both mean "no calls"; canonical form omits the key
            message["tool_calls"] = _normalize_tool_calls(tool_calls, index, calls)
    if role == "tool":
        message["tool_call_id"] = calls.answered(turn.get("tool_call_id"), index)
    return message


def _normalize_content(content: Any, role: str, index: int) -> str:
    if isinstance(content, str):
        return content
    if content is None and role == "assistant":  # OpenAI allows null content beside tool calls
        return ""
    if isinstance(content, list):
        texts = []
        for part in content:
            is_text = isinstance(part, dict) and part.get("type") == "text"
            if not (is_text and isinstance(part.get("text"), str)):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RecordError(
                    "non_string_content", f"turn {index}: content part {kind!r} is not text"
                )
            texts.append(part["text"])
        return _PART_SEPARATOR.join(texts)
    raise RecordError(
        "non_string_content", f"turn {index}: content is {type(content).__name__}, not text"
    )


def _parse_function_call_value(value: Any, index: int) -> list[Any]:
    # LLaMA-Factory: the value is a JSON object {"name", "arguments"} or a list of them.
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            raise RecordError("bad_tool_call", f"turn {index}: function_call is not JSON") from None
    return value if isinstance(value, list) else [value]


def _normalize_tool_calls(tool_calls: Any, index: int, calls: _CallIds) -> list[dict[str, Any]]:
    if not isinstance(tool_calls, list):
        raise RecordError("bad_tool_call", f"turn {index}: tool_calls must be a list")
    out = []
    for call in tool_calls:
        if not isinstance(call, dict):
            raise RecordError("bad_tool_call", f"turn {index}: a tool call is not an object")
        # Some datasets flatten {"name", "arguments"} into the call itself.
        function = call.get("function", call)
        call_type = call.get("type") or "function"
        if call_type != "function" or not isinstance(function, dict):
            raise RecordError("bad_tool_call", f"turn {index}: not a function call")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise RecordError("bad_tool_call", f"turn {index}: tool call without a function name")
        arguments = _canonical_arguments(function.get("arguments"), index)
        out.append(
            {
                "id": calls.called(name, call.get("id")),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    return out


def _canonical_arguments(arguments: Any, index: int) -> str:
    # Strings are kept verbatim (they are what a model wrote); objects become compact sorted JSON.
    if isinstance(arguments, str):
        return arguments
    if arguments is None:
        return "{}"
    if not isinstance(arguments, dict):
        raise RecordError("bad_tool_call", f"turn {index}: arguments must be an object or string")
    try:
        return orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONEncodeError as err:
        raise RecordError("bad_tool_call", f"turn {index}: arguments: {err}") from None


def normalize_tools(tools: Any) -> list[Tool] | None:
    """Tools as OpenAI function tools; a JSON string is parsed, bare schemas are wrapped.

    None and [] both become None (no tools), so they give the same prompt_id.
    """
    if isinstance(tools, str):
        if not tools.strip():
            return None
        try:
            tools = orjson.loads(tools)
        except orjson.JSONDecodeError:
            raise RecordError("bad_shape", "'tools' is a string but not JSON") from None
    if not tools:
        return None
    if not isinstance(tools, list):
        raise RecordError("bad_shape", f"'tools' must be a list, got {type(tools).__name__}")
    out = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise RecordError("bad_shape", "a tool is not an object")
        if "function" not in tool and "name" in tool:
            tool = {"type": "function", "function": tool}
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RecordError("bad_shape", "a tool without a function name")
        out.append(tool)
    try:
        orjson.dumps(out, option=orjson.OPT_SORT_KEYS)  # must be hashable by prompt_id
    except orjson.JSONEncodeError as err:
        raise RecordError("bad_shape", f"tools are not JSON-serializable: {err}") from None
    return out


def validate_prompt_messages(messages: Any, tools: Any = None) -> None:
    """Check that `messages` is a prompt the target can answer; raise `RecordError` if not.

    Used on normalized output and by the generate stage on what it consumes: roles known,
    contents strings, tool results carry `tool_call_id`, assistant tool calls have a function
    name and string arguments, some user turn exists, the last turn is not an assistant's, and
    the tools, when given, are function tools.
    """
    if not isinstance(messages, list):
        raise RecordError("bad_shape", "messages must be a list")
    if not messages:
        raise RecordError("empty_messages", "the conversation has no turns")
    for index, message in enumerate(messages):
        _validate_message(message, index)
    if tools is not None:
        validate_tools(tools)
    if messages[-1]["role"] == "assistant":
        raise RecordError("ends_with_assistant", "the last turn is already an assistant answer")
    if not any(message["role"] == "user" for message in messages):
        raise RecordError("no_user_turn", "no user turn: nothing to answer")


def validate_tools(tools: Any) -> None:
    """Tools as `normalize_tools` leaves them: `{"type": "function", "function": {"name", …}}`
    with an object of parameters. Anything else is the prompt's fault, found before a request:
    a server refuses it, or fails on it with a 5xx that would be retried as transient."""
    if not isinstance(tools, list):
        raise RecordError("bad_tools", f"tools must be a list, got {type(tools).__name__}")
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise RecordError("bad_tools", f"tool {index} is not an object")
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise RecordError("bad_tools", f"tool {index} is not a function tool")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise RecordError("bad_tools", f"tool {index}: the function has no name")
        if not isinstance(function.get("parameters", {}), dict | None):
            raise RecordError("bad_tools", f"tool {index} ({name}): parameters is not an object")
        if not isinstance(function.get("description", ""), str | None):
            raise RecordError("bad_tools", f"tool {index} ({name}): description is not text")


def _validate_message(message: Any, index: int) -> None:
    if not isinstance(message, dict):
        raise RecordError("bad_shape", f"message {index} is not an object")
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise RecordError("unknown_role", f"message {index}: role {role!r}")
    if not isinstance(message.get("content"), str):
        raise RecordError("non_string_content", f"message {index}: content is not a string")
    for key in ("name", "reasoning_content"):
        if message.get(key) is not None and not isinstance(message[key], str):
            raise RecordError("bad_shape", f"message {index}: {key!r} must be a string")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise RecordError("missing_tool_call_id", f"message {index}: tool without tool_call_id")
    tool_calls = message.get("tool_calls")
    if tool_calls is None:
        return
    if role != "assistant" or not isinstance(tool_calls, list):
        raise RecordError("bad_tool_call", f"message {index}: tool_calls must be an assistant list")
    for call in tool_calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not (
            isinstance(function, dict)
            and isinstance(function.get("name"), str)
            and function["name"]
            and isinstance(function.get("arguments"), str)
        ):
            raise RecordError(
                "bad_tool_call", f"message {index}: tool call needs function name and arguments"
            )


def prompt_id(messages: list[Message], tools: list[Tool] | None) -> str:
    """The stable id of a canonical prompt: 32 hex chars (128 bits) of a SHA-256.

    Canonical form, hashed as bytes (FIRM — changing it silently re-keys every prompt and
    breaks de-duplication across publish runs; tests pin a known id):

        orjson.dumps({"messages": messages, "tools": tools or []}, option=OPT_SORT_KEYS)

    i.e. compact UTF-8 JSON, object keys sorted at every depth, non-ASCII unescaped, where
    `messages` and `tools` are the output of `normalize_conversation`: only MESSAGE_KEYS, absent
    rather than null or empty, tool-call arguments as strings (objects → compact sorted JSON),
    ShareGPT roles mapped to OpenAI roles, trailing assistant turns dropped. Text is hashed
    exactly as given (no whitespace or Unicode normalization).
    """
    canonical = orjson.dumps(
        {"messages": messages, "tools": tools or []}, option=orjson.OPT_SORT_KEYS
    )
    return hashlib.sha256(canonical).hexdigest()[:32]


# the field of a source row that holds the row's own id, unless the user names another
DEFAULT_ID_FIELD = "id"
# a source id longer than this is not an id a user joins on: refused, not cut
MAX_SOURCE_ID = 1024


def source_id_of(raw: Any, id_field: str = DEFAULT_ID_FIELD) -> str | None:
    """The row's own id as text (an integer id too), None when it has none."""
    value = raw.get(id_field) if isinstance(raw, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise RecordError(
            "bad_source_id",
            f"field {id_field!r}: expected a string or an integer, got {type(value).__name__}",
        )
    text = str(value)
    if len(text) > MAX_SOURCE_ID:
        raise RecordError(
            "bad_source_id", f"field {id_field!r}: {len(text)} characters, at most {MAX_SOURCE_ID}"
        )
    return text or None


def make_prompt_record(
    raw: Any,
    source: str,
    meta: dict[str, Any] | None = None,
    id_field: str = DEFAULT_ID_FIELD,
) -> PromptRecord:
    """Normalize a source row into a `PromptRecord` (raises `RecordError` for dead letters)."""
    messages, tools = normalize_conversation(raw)
    return PromptRecord(
        prompt_id=prompt_id(messages, tools),
        messages=messages,
        source=source,
        tools=tools,
        meta=dict(meta or {}),
        source_id=source_id_of(raw, id_field),
    )
