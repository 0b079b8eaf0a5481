"""A line per generation request (`--request-log FILE`): which prompt, when, how it ended.

The emulator cannot know a prompt's id (SGLang's API carries none), so a request names its
prompt by `prompt_digest` of the messages it was sent; whoever holds the prompts computes the
same digest and so counts how often each prompt was requested and answered (the join-storm
test: prompts requested more than once, successful generations thrown away).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import IO, Any

import orjson
from aiohttp import web

# set on a request whose answer was cut in the middle of its body (transport.send_truncated)
CUT_KEY = web.RequestKey("emulator_cut", bool)
LOGGED_PATHS = ("/v1/chat/completions", "/generate")


def prompt_digest(prompt: Any) -> str:
    """A chat request's messages (or a native request's text or ids), digested."""
    canonical = orjson.dumps(prompt, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()[:20]


def outcome_of(status: int | None, cut: bool) -> str:
    """ok: a whole answer; cut: a whole generation whose body was cut off; reset: the
    connection reset without an answer; http_N: an error answer; gone: no response at all
    (the server stopping in the middle)."""
    if status is None:
        return "gone"
    if status == 200:
        return "cut" if cut else "ok"
    return "reset" if status == 499 else f"http_{status}"


class RequestLog:
    """Appends one JSON line per request; a line is written whole, at the request's end."""

    def __init__(self, path: Path) -> None:
        self._file: IO[bytes] = path.open("ab")

    async def around(self, request: web.Request, handler: Any) -> web.StreamResponse:
        started = time.time()
        status: int | None = None
        prompt: str | None = None
        try:
            body = orjson.loads(await request.read())
            if isinstance(body, dict):
                prompt = prompt_digest(
                    body.get("messages") or body.get("text") or body.get("input_ids")
                )
        except ValueError:
            pass  # the handler answers the bad body
        try:
            response = await handler(request)
            status = response.status
            return response
        finally:
            line = {
                "prompt": prompt,
                "path": request.path,
                "start": round(started, 3),
                "end": round(time.time(), 3),
                "outcome": outcome_of(status, request.get(CUT_KEY, False)),
            }
            self._file.write(orjson.dumps(line) + b"\n")
            self._file.flush()

    async def cleanup(self, _app: web.Application) -> None:
        self._file.close()
