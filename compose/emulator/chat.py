"""POST /v1/chat/completions, non-streaming, as SGLang's OpenAIServingChat answers it (or vLLM's,
for `--kind vllm`)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from compose.emulator import errors
from compose.emulator.engine import ENGINE_KEY, ConnectionGone, Engine
from compose.emulator.generation import Generation, GenerationRequest, ThinkMode
from compose.emulator.model import EmulatedModel, TemplateError
from compose.emulator.token_ids import IDS_REQUEST_FIELDS, attach_token_ids
from compose.emulator.transport import send_truncated
from streams.core.parsers import split_reasoning
from streams.core.recipes import NATIVE_NAMES, Sampling, sampling_error
from streams.core.serving import ContentFormat, NormalizationError, ServerNormalization


@dataclass(frozen=True)
class ChatRequest:
    """The parts of a chat request the emulator acts on."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None  # as SGLang hands them to the template
    template_kwargs: dict[str, Any]
    max_new_tokens: int | None
    skip_special_tokens: bool
    separate_reasoning: bool
    no_stop_trim: bool
    # the request fields that ask for token ids (compose/emulator/token_ids.py)
    ids_asked: dict[str, Any]
    continue_final_message: bool
    input_ids: list[int] | None

    @property
    def thinking(self) -> bool:
        # SGLang's _get_reasoning_from_request: thinking unless the kwarg says False
        kwargs = self.template_kwargs
        return not any(kwargs.get(k) is False for k in ("thinking", "enable_thinking"))


def parse_chat_request(
    body: Any, profile: ServerNormalization, content_format: ContentFormat = "string"
) -> ChatRequest:
    """The request as SGLang of the profile's versions hands it to the template."""
    if not isinstance(body, dict):
        raise errors.bad_request("The request body must be a JSON object.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise errors.bad_request("messages must be a non-empty list")
    if body.get("stream"):
        raise errors.bad_request("stream=true is not supported by the emulator")
    if (body.get("n") or 1) != 1:
        raise errors.bad_request("n > 1 is not supported by the emulator")
    sent_kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(sent_kwargs, dict):
        raise errors.bad_request("chat_template_kwargs must be an object")
    template_kwargs = profile.template_kwargs(sent_kwargs, body.get("reasoning_effort"))
    if body.get("reasoning_effort") == "none":
        template_kwargs.setdefault("thinking", False)
        template_kwargs.setdefault("enable_thinking", False)
    if any(not isinstance(m, dict) or "role" not in m for m in messages):
        raise errors.bad_request("each message needs a role")
    check_sampling(body)
    try:
        prepared, tools = profile.prepare(
            messages,
            body.get("tools"),
            tool_choice=body.get("tool_choice", "auto"),
            content_format=content_format,
        )
    except NormalizationError as exc:
        raise errors.bad_request(str(exc)) from exc
    max_new = body.get("max_completion_tokens")
    if max_new is None:
        max_new = body.get("max_tokens")
    if max_new is not None and (not isinstance(max_new, int) or max_new < 0):
        raise errors.bad_request("max_tokens must be a non-negative integer")
    input_ids = body.get("input_ids")
    if input_ids is not None and not (
        isinstance(input_ids, list) and all(isinstance(i, int) for i in input_ids)
    ):
        raise errors.bad_request("input_ids must be a list of integers")
    return ChatRequest(
        messages=prepared,
        tools=tools,
        template_kwargs=template_kwargs,
        max_new_tokens=max_new,
        # SGLang keeps special tokens when tools are given, for the tool-call parser
        skip_special_tokens=bool(body.get("skip_special_tokens", True)) and not tools,
        separate_reasoning=bool(body.get("separate_reasoning", True)),
        no_stop_trim=bool(body.get("no_stop_trim", False)),
        ids_asked={k: body[k] for k in IDS_REQUEST_FIELDS if k in body},
        continue_final_message=bool(body.get("continue_final_message", False)),
        input_ids=input_ids,
    )


def check_sampling(values: dict[str, Any], names: dict[str, str] | None = None) -> None:
    """SGLang's SamplingParams.verify: a sampling parameter out of its range is a 400 (the
    ranges of streams/core/recipes.py `Sampling`, which refuses them at publish). `names`: the
    request's name of each (`/generate`'s); max tokens are checked where they are read."""
    names = names or {}
    given = {
        field: values[names.get(field, field)]
        for field in Sampling.model_fields
        if field != "max_tokens" and values.get(names.get(field, field)) is not None
    }
    try:
        Sampling.model_validate(given)
    except ValidationError as err:
        raise errors.bad_request(sampling_error(err)) from None


def check_native_sampling(params: dict[str, Any]) -> None:
    check_sampling(params, NATIVE_NAMES)


def history_tool_calls(messages: list[dict[str, Any]]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")


def render_prompt(model: EmulatedModel, chat: ChatRequest) -> tuple[str, list[int]]:
    if chat.input_ids is not None:
        return model.decode(chat.input_ids, skip_special_tokens=False), list(chat.input_ids)
    try:
        text = model.render(
            chat.messages, chat.tools, chat.template_kwargs, chat.continue_final_message
        )
    except TemplateError as exc:
        raise errors.bad_request(str(exc)) from exc
    return text, model.encode(text)


def build_response(
    engine: Engine,
    chat: ChatRequest,
    prompt_ids: list[int],
    generation: Generation,
) -> dict[str, Any]:
    model = engine.model
    family = model.family
    ids = generation.output_ids
    stopped = generation.finish_reason == "stop" and generation.matched_stop is not None
    text_ids = ids[:-1] if stopped and not chat.no_stop_trim else ids
    text = model.decode_output(text_ids, skip_special_tokens=chat.skip_special_tokens)

    reasoning: str | None = None
    content = text
    reasoning_tokens = 0
    if family.reasoning_parser and chat.separate_reasoning and chat.thinking:
        force = generation.mode is ThinkMode.PREFILLED
        tool_start = family.tool_start if chat.tools else None
        split = split_reasoning(text, family.think_open, family.think_close, force, tool_start)
        reasoning = split[0] or None
        content = split[1]
        if reasoning is not None:
            reasoning_tokens = _reasoning_tokens(model, text_ids)

    finish_reason = generation.finish_reason
    tool_calls: list[dict[str, Any]] | None = None
    if chat.tools and family.tool_call_parser:
        history = history_tool_calls(chat.messages)
        content, calls = family.parse_tool_calls(content, chat.tools, history)
        if calls:
            tool_calls = [call.to_openai(i) for i, call in enumerate(calls)]
            if finish_reason == "stop":
                finish_reason = "tool_calls"

    choice: dict[str, Any] = {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": content,
            "reasoning_content": reasoning,
            "tool_calls": tool_calls,
        },
        "logprobs": None,
        "finish_reason": finish_reason,
        "matched_stop": generation.matched_stop,
    }
    response: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": engine.settings.model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt_ids) + len(ids),
            "prompt_tokens_details": None,
            "reasoning_tokens": reasoning_tokens,
        },
        "metadata": {"weight_version": "default"},
    }
    if engine.settings.kind == "vllm":
        response = _as_vllm(response)
    attach_token_ids(engine.settings.ids_style, chat.ids_asked, response, prompt_ids, ids)
    return response


def _as_vllm(response: dict[str, Any]) -> dict[str, Any]:
    """The same answer in vLLM's shape (chat_completion/protocol.py ChatCompletionResponse,
    ChatMessage): the reasoning as `reasoning`, `stop_reason` for `matched_stop`, no
    `tool_calls` when there are none; `return_token_ids` adds the ids (token_ids.py)."""
    choice = response["choices"][0]
    sent = choice["message"]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": sent["content"],
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": sent["tool_calls"] or [],
        "reasoning": sent["reasoning_content"],
    }
    if not message["tool_calls"]:
        del message["tool_calls"]
    usage = response["usage"]
    return {
        "id": response["id"],
        "object": "chat.completion",
        "created": response["created"],
        "model": response["model"],
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": choice["finish_reason"],
                # the matched stop string or token; None for the end-of-sequence token
                "stop_reason": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


def _reasoning_tokens(model: EmulatedModel, text_ids: list[int]) -> int:
    """Output tokens before </think> (all of them when it never closed), without <think>."""
    close, open_ = model.special.think_close, model.special.think_open
    end = text_ids.index(close) if close is not None and close in text_ids else len(text_ids)
    start = 1 if text_ids and open_ is not None and text_ids[0] == open_ else 0
    return max(0, end - start)


async def handle_chat(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    engine.stats.count_request()
    try:
        try:
            body = await request.json(loads=orjson.loads)
        except ValueError as exc:
            raise errors.bad_request(f"Invalid JSON body: {exc}") from exc
        chat = parse_chat_request(body, engine.normalization, engine.content_format)
        prompt_text, prompt_ids = render_prompt(engine.model, chat)
        engine.check_context(prompt_text, len(prompt_ids), chat.max_new_tokens)
        job = GenerationRequest(
            prompt_text=prompt_text,
            prompt_len=len(prompt_ids),
            max_new_tokens=chat.max_new_tokens,
            thinking=chat.thinking,
            tools=chat.tools,
            history_tool_calls=history_tool_calls(chat.messages),
        )
        outcome = await engine.run(request, job)
    except errors.ApiError as error:
        engine.stats.errors[error.kind] += 1
        return errors.openai_error_response(error)
    except ConnectionGone:
        return web.Response(status=499)  # never reaches the client: the socket is gone
    payload = build_response(engine, chat, prompt_ids, outcome.generation)
    if outcome.drop:
        return await send_truncated(request, orjson.dumps(payload))
    return errors.json_response(payload)
