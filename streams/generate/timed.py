"""The server client, counting requests and timing the successful ones (failures are counted by
the stage, by kind)."""

from __future__ import annotations

import time
from collections.abc import Callable

from streams.core.records import CompletionRecord, PromptRecord
from streams.core.settings import GenerateSettings
from streams.generate.client import HttpServerClient
from streams.generate.stats import GenerateStats


class TimedClient(HttpServerClient):
    def __init__(
        self, settings: GenerateSettings, stats: GenerateStats, observe: Callable[[float], None]
    ):
        super().__init__(settings)
        self.stats = stats
        self.observe = observe  # seconds to a successful completion

    async def complete(self, prompt: PromptRecord) -> CompletionRecord:
        self.stats.requests += 1
        started = time.monotonic()
        completion = await super().complete(prompt)
        self.observe(time.monotonic() - started)
        return completion
