"""The workers' figures the tools show (status, `run`'s console, report), each named by the
stats field that declares it (streams/observe/figures.py `figure_of`), not by its heartbeat
key: a renamed field fails here, on import and in mypy."""

from __future__ import annotations

from collections.abc import Iterable

from streams.generate.stats import AUTH, DOWN, REFUSING, GenerateStats
from streams.observe.figures import figure_of, note_of
from streams.observe.heartbeat import Heartbeat
from streams.tokenize.stats import TokenizeStats

# a generate worker's, summed per server
IN_FLIGHT = figure_of(GenerateStats, lambda s: s.in_flight)
PAUSED = figure_of(GenerateStats, lambda s: s.paused)
PAUSED_AUTH = figure_of(GenerateStats, lambda s: s.paused_for)
REFUSES = figure_of(GenerateStats, lambda s: s.refusing)
REQUESTS = figure_of(GenerateStats, lambda s: s.requests)
COMPLETED = figure_of(GenerateStats, lambda s: s.completed)
DEAD_LETTERS = figure_of(GenerateStats, lambda s: s.dead_letters)
OUTPUT_TOKENS = figure_of(GenerateStats, lambda s: s.output_tokens)
FAILED = figure_of(GenerateStats, lambda s: s.errors)
EXACT_IDS = note_of(GenerateStats, lambda s: s.exact_ids)

# a tokenize worker's, summed per dataset
SAMPLES = figure_of(TokenizeStats, lambda s: s.samples)
TOKENS = figure_of(TokenizeStats, lambda s: s.tokens)
DUPLICATES = figure_of(TokenizeStats, lambda s: s.sink.duplicates)
LETTERED = figure_of(TokenizeStats, lambda s: s.dead_letters)


def paused_state(beats: Iterable[Heartbeat]) -> str:
    """Why a server's workers take no requests: AUTH, REFUSING, DOWN, or "" (they do)."""
    beats = list(beats)
    if any(b.figure(PAUSED_AUTH) for b in beats):
        return AUTH
    if any(b.figure(REFUSES) for b in beats):
        return REFUSING
    return DOWN if any(b.figure(PAUSED) for b in beats) else ""
