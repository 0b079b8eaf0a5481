"""Waiting for a `run` to finish: until every prompt of the run has its outcome, or a worker
exits, or the run's timeout passes."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from sinks.shards import ShardStore
from streams.core.meter import Meter
from streams.core.retry import backoff, until_done
from streams.core.settings import KafkaSettings
from streams.core.turns import finished
from streams.tools.console import RunConsole
from streams.tools.progress import (
    DatasetFigures,
    DeadLetterReader,
    DeadLetterTally,
    dataset_figures,
)

if TYPE_CHECKING:  # compose is imported when `run` runs, not when the parser is built
    from compose.process import ManagedProcess


class RunFailed(Exception):
    pass


log = logging.getLogger(__name__)
# polling progress: retried quickly, the run's timeout bounds it
STORAGE_BACKOFF = backoff("poll")
TOKENIZE_STAGE = "tokenize"


@dataclass
class RunResult:
    figures: DatasetFigures
    dead_letters: DeadLetterTally
    prompt_ids: set[str]  # the run's
    elapsed_s: float

    @property
    def expected(self) -> int:
        return len(self.prompt_ids)


async def wait_until_done(
    kafka: KafkaSettings,
    store: ShardStore,
    expected: set[str],
    workers: list[ManagedProcess],
    timeout_s: float,
    show_progress: bool = True,
) -> RunResult:
    """Until every expected prompt id has its outcome: a committed sample or a recorded drop of
    the dataset version, or a dead letter of the publish or generate stage."""
    started = time.monotonic()
    reader = DeadLetterReader(kafka)
    # a bar on a terminal, a plain line every few seconds in a log (streams/core/meter.py)
    meter = Meter("run", "prompt", len(expected)) if show_progress else None
    console = RunConsole(kafka, partial(_say, meter))
    try:
        while True:
            # storage may be down or just back (a restarted S3 answers 500 for a moment): the
            # workers wait that out, and so does the wait for them, within the run's timeout
            reading = until_done(
                "reading the dataset's progress",
                lambda: asyncio.to_thread(dataset_figures, store),
                STORAGE_BACKOFF,
                log,
            )
            remaining = timeout_s - (time.monotonic() - started)
            try:
                figures = await asyncio.wait_for(reading, timeout=max(remaining, 1.0))
            except TimeoutError:
                raise RunFailed(f"not done after {timeout_s:.0f}s: storage unreadable") from None
            tally = await reader.poll()
            await console.poll()
            upstream = tally.ids_before(TOKENIZE_STAGE)
            # every-turn conversations are done when each of their turns is
            done = len(finished(expected, figures.prompt_ids | upstream))
            if meter is not None:
                meter.update(done)
            if done == len(expected):
                if meter is not None:
                    meter.close(
                        f"run: {done:,} prompts done: {figures.samples:,} samples, "
                        f"{len(figures.drops) + len(upstream):,} dropped"
                    )
                return RunResult(figures, tally, set(expected), time.monotonic() - started)
            for worker in workers:
                if not worker.alive():
                    raise RunFailed(exit_line(worker))
            if time.monotonic() - started > timeout_s:
                raise RunFailed(f"not done after {timeout_s:.0f}s: {done}/{len(expected)} prompts")
            await asyncio.sleep(1.0)
    finally:
        await reader.close()
        await console.close()


def _say(meter: Meter | None, line: str) -> None:
    """A console line of the run; above the progress bar when there is one."""
    line = f"draftgen run: {line}"
    if meter is not None:
        meter.say(line)
    else:
        print(line, file=sys.stderr, flush=True)


# what a worker's log says when it fails: the last such line is why it exited
_FAILURE_LEVELS = (" ERROR ", " CRITICAL ", "error:")


def exit_line(worker: ManagedProcess) -> str:
    """Which worker exited, with what status and why (its last error line), and its log."""
    code = worker.popen.returncode if worker.popen is not None else None
    why = next(
        (
            line.strip()
            for line in reversed(worker.tail(200).splitlines())
            if any(level in line for level in _FAILURE_LEVELS)
        ),
        "",
    )
    return (
        f"worker {worker.name} exited with status {code}"
        + (f": {why[:300]}" if why else "")
        + f"; see {worker.log_path}"
    )
