"""The tail benchmark's plain batch client: what a user without the pipeline would run, in a
process of its own (bench_tail.py --batch-client SPEC)."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

from tests.benchmarks.proc import peak_rss_mib


async def run_batch(spec: dict[str, Any]) -> dict[str, Any]:
    import httpx
    import openai

    prompts = [json.loads(line) for line in Path(spec["prompts"]).read_text().splitlines()]
    servers = spec["servers"]
    slots = spec["slots"]
    clients = []
    for url in servers:
        limits = httpx.Limits(max_connections=slots, max_keepalive_connections=slots)
        http = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(1800.0, connect=10.0))
        clients.append(openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="EMPTY", http_client=http))
    model = (await clients[0].models.list()).data[0].id
    semaphores = [asyncio.Semaphore(slots) for _ in servers]
    freed = asyncio.Event()
    tokens: list[int] = [0] * len(prompts)
    failures = 0

    async def one(index: int, server: int) -> None:
        nonlocal failures
        try:
            for _attempt in range(5):
                try:
                    response = await clients[server].chat.completions.create(
                        model=model,
                        messages=prompts[index]["messages"],
                        temperature=1.0,
                        top_p=0.95,
                        max_tokens=8192,
                        extra_body={
                            "chat_template_kwargs": {"enable_thinking": True},
                            "separate_reasoning": True,
                            "return_token_ids": True,
                        },
                    )
                except openai.APIError:
                    continue
                answers[index] = response.model_dump()
                tokens[index] = response.usage.completion_tokens if response.usage else 0
                return
            failures += 1
        finally:
            semaphores[server].release()
            freed.set()

    answers: list[Any] = [None] * len(prompts)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    started = time.time()
    tasks = []
    for index in range(len(prompts)):
        while True:  # the first server with a free slot, in arrival order
            free = next((s for s, sem in enumerate(semaphores) if not sem.locked()), None)
            if free is not None:
                break
            freed.clear()
            await freed.wait()
        await semaphores[free].acquire()
        tasks.append(asyncio.create_task(one(index, free)))
    await asyncio.gather(*tasks)
    ended = time.time()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    for client in clients:
        await client.close()
    return {
        "started": started,
        "ended": ended,
        "tokens": tokens,
        "failures": failures,
        "cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
        # not ru_maxrss: after fork+exec Linux reports the parent's high-water mark there
        "peak_rss_mib": peak_rss_mib(os.getpid()),
    }


def batch_client_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    print(json.dumps(asyncio.run(run_batch(spec))))
    return 0
