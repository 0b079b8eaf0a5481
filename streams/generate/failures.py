"""What a failed request to the server means to the worker: permanent (dead letter at once),
transient (retry with backoff), server-down (pause the worker until /health_generate answers) or
refused credentials (401/403: pause the worker until the server accepts its API key).
"""

from __future__ import annotations

import httpx2
import openai

AUTH_STATUSES = (401, 403)


class GenerationError(Exception):
    """A request that failed; `transient` says whether retrying can help, `auth` that the
    server refused the credentials (the operator's to fix, not the prompt's fault)."""

    def __init__(
        self,
        kind: str,
        message: str,
        transient: bool,
        server_down: bool = False,
        auth: bool = False,
    ):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.transient = transient
        self.server_down = server_down
        self.auth = auth


def classify(err: Exception) -> GenerationError:
    if isinstance(err, openai.APITimeoutError | httpx2.TimeoutException):
        return GenerationError("timeout", "request timed out", transient=True)
    if isinstance(err, openai.APIConnectionError | httpx2.TransportError):
        # Refused or reset: the server may be down; the caller probes health before counting it.
        return GenerationError("connection_error", _short(err), transient=True, server_down=True)
    if isinstance(err, openai.APIStatusError):
        return status_error(err.status_code, _error_message(err))
    return GenerationError(type(err).__name__, _short(err), transient=False)


def status_error(status: int, message: str) -> GenerationError:
    if status in AUTH_STATUSES:
        return GenerationError(f"http_{status}", message, transient=False, auth=True)
    if status == 400 and "context length" in message:
        return GenerationError("context_too_long", message, transient=False)
    if status in (408, 429) or status >= 500:
        return GenerationError(f"http_{status}", message, transient=True)
    return GenerationError(f"http_{status}", message, transient=False)


def _error_message(err: openai.APIStatusError) -> str:
    body = err.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"][:500]
    return _short(err)


def _short(err: Exception) -> str:
    return (str(err) or type(err).__name__).splitlines()[0][:500]
