"""Errors in the shapes SGLang answers with."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web


class ApiError(Exception):
    """An error answer; `err_type` follows SGLang (BadRequestError, InternalServerError, "503")."""

    def __init__(
        self,
        status: int,
        message: str,
        err_type: str = "BadRequestError",
        kind: str = "bad_request",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.kind = kind  # the /stats counter it goes to


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def queue_full(kind: str = "queue_full") -> ApiError:
    # The scheduler aborts with 503; SGLang's HTTPException handler types it by the status code.
    return ApiError(503, "The request queue is full.", "503", kind)


def internal_error(message: str, kind: str = "internal") -> ApiError:
    return ApiError(500, f"Internal server error: {message}", "InternalServerError", kind)


def context_too_long(input_tokens: int, context_len: int, kind: str = "context_length") -> ApiError:
    return ApiError(
        400,
        f"The input ({input_tokens} tokens) is longer than the model's context length "
        f"({context_len} tokens).",
        kind=kind,
    )


def total_too_long(input_tokens: int, max_new_tokens: int, context_len: int) -> ApiError:
    return ApiError(
        400,
        "Requested token count exceeds the model's maximum context length "
        f"of {context_len} tokens. You requested a total of {input_tokens + max_new_tokens} "
        f"tokens: {input_tokens} tokens from the input messages and "
        f"{max_new_tokens} tokens for the completion. Please reduce the number "
        "of tokens in the input messages or the completion to fit within the limit.",
        kind="context_length",
    )


def json_response(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


def openai_error_response(error: ApiError) -> web.Response:
    """The OpenAI-compatible endpoints' ErrorResponse."""
    return json_response(
        {
            "object": "error",
            "message": error.message,
            "type": error.err_type,
            "param": None,
            "code": error.status,
        },
        status=error.status,
    )


def native_error_response(error: ApiError) -> web.Response:
    """/generate: request errors are {"error": {"message": ...}}; aborts use ErrorResponse."""
    if error.status == 400:
        return json_response({"error": {"message": error.message}}, status=400)
    return openai_error_response(error)
