"""SGLang's native endpoints: POST /generate and POST /v1/tokenize."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from aiohttp import web

from compose.emulator import errors
from compose.emulator.chat import check_native_sampling, parse_chat_request, render_prompt
from compose.emulator.engine import ENGINE_KEY, ConnectionGone, Engine
from compose.emulator.generation import GenerationRequest
from compose.emulator.transport import send_truncated

# SamplingParams.max_new_tokens defaults to 128 on /generate (the chat endpoint has no cap).
DEFAULT_MAX_NEW_TOKENS = 128


def _prompt(engine: Engine, body: dict[str, Any]) -> tuple[str, list[int]]:
    model = engine.model
    input_ids = body.get("input_ids")
    text = body.get("text")
    if input_ids is not None:
        if not isinstance(input_ids, list) or not all(isinstance(i, int) for i in input_ids):
            raise errors.bad_request("input_ids must be a list of integers (no batches)")
        if any(i < 0 or i >= model.vocab_size for i in input_ids):
            raise errors.bad_request(
                f"The input_ids {input_ids} contains values greater than the vocab size "
                f"({model.vocab_size})."
            )
        return model.decode(input_ids, skip_special_tokens=False), list(input_ids)
    if isinstance(text, str):
        return text, model.encode(text)
    raise errors.bad_request("Either text or input_ids should be provided.")


async def handle_generate(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    engine.stats.count_request()
    try:
        try:
            body = await request.json(loads=orjson.loads)
        except ValueError as exc:
            raise errors.bad_request(f"Invalid JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise errors.bad_request("The request body must be a JSON object.")
        if body.get("stream"):
            raise errors.bad_request("stream=true is not supported by the emulator")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise errors.bad_request("sampling_params must be an object")
        check_native_sampling(params)
        max_new = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        prompt_text, prompt_ids = _prompt(engine, body)
        engine.check_context(prompt_text, len(prompt_ids), max_new)
        job = GenerationRequest(
            prompt_text=prompt_text,
            prompt_len=len(prompt_ids),
            max_new_tokens=max_new,
            thinking=True,  # a raw prompt that prefills nothing: the model thinks if it can
        )
        outcome = await engine.run(request, job)
    except errors.ApiError as error:
        engine.stats.errors[error.kind] += 1
        return errors.native_error_response(error)
    except ConnectionGone:
        return web.Response(status=499)

    generation = outcome.generation
    ids = generation.output_ids
    stopped = generation.finish_reason == "stop" and generation.matched_stop is not None
    trim = stopped and not params.get("no_stop_trim", False)
    text = engine.model.decode_output(
        ids[:-1] if trim else ids,
        skip_special_tokens=bool(params.get("skip_special_tokens", True)),
    )
    finish: dict[str, Any] = (
        {"type": "stop", "matched": generation.matched_stop}
        if stopped
        else {"type": "length", "length": len(ids)}
    )
    payload = {
        "text": text,
        "output_ids": ids,
        "meta_info": {
            "id": body.get("rid") or uuid.uuid4().hex,
            "finish_reason": finish,
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": "default",
            "e2e_latency": outcome.latency_s,
        },
    }
    if outcome.drop:
        return await send_truncated(request, orjson.dumps(payload))
    return errors.json_response(payload)


async def handle_tokenize(request: web.Request) -> web.Response:
    """Token ids of a prompt string, or of messages rendered with the server's template."""
    engine = request.app[ENGINE_KEY]
    try:
        try:
            body = await request.json(loads=orjson.loads)
        except ValueError as exc:
            raise errors.bad_request(f"Invalid JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise errors.bad_request("The request body must be a JSON object.")
        if "messages" in body:
            chat = parse_chat_request(body, engine.normalization, engine.content_format)
            _, ids = render_prompt(engine.model, chat)
        elif isinstance(body.get("prompt"), str):
            ids = engine.model.encode(body["prompt"])
        else:
            raise errors.bad_request("prompt (a string) or messages is required")
    except errors.ApiError as error:
        return errors.openai_error_response(error)
    return errors.json_response(
        {"tokens": ids, "count": len(ids), "max_model_len": engine.settings.max_model_len}
    )
