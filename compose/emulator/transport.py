"""Connection-level failures: a reset after a hang, a body cut off in the middle."""

from __future__ import annotations

import contextlib
import socket
import struct

from aiohttp import web

from compose.emulator.request_log import CUT_KEY


def reset_connection(request: web.Request) -> None:
    """Close with RST (SO_LINGER 0), as a crashed server or a proxy timeout does."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def send_truncated(request: web.Request, body: bytes) -> web.StreamResponse:
    """Promise the whole body in Content-Length, send half of it, then reset the connection."""
    response = web.StreamResponse(status=200)
    response.content_type = "application/json"
    response.content_length = len(body)
    await response.prepare(request)
    await response.write(body[: len(body) // 2])
    request[CUT_KEY] = True
    reset_connection(request)
    return response
