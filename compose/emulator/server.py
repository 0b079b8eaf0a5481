"""Run the emulator: serve() in a running loop, run() blocking until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import signal

from aiohttp import web

from compose.emulator.app import build_app
from compose.emulator.settings import EmulatorSettings


async def serve(settings: EmulatorSettings, stop: asyncio.Event | None = None) -> None:
    """Listen until `stop` is set, or until SIGTERM / SIGINT when no event is given."""
    app = build_app(settings)
    # in-flight requests (a hang can last a minute) get a short grace on shutdown
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, reuse_address=True)
    await site.start()
    port = settings.port or _bound_port(runner)
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            # not available off the main thread or on Windows: then only `stop` ends it
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
    print(f"emulator listening on http://{settings.host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise RuntimeError("the emulator is not bound to a TCP port")


def run(settings: EmulatorSettings) -> None:
    """Blocking: serve until SIGTERM or SIGINT, then stop cleanly."""
    asyncio.run(serve(settings))
