"""A generate worker's counters, each field declaring its figure once (streams/observe/figures.py):
its heartbeat key and its Prometheus name."""

from __future__ import annotations

from dataclasses import dataclass, field

from streams.observe.figures import (
    Figure,
    Figures,
    figure,
    figure_of,
    figured,
    note,
    read_figures,
)

# why a server cannot take requests now (`HttpServerClient.unavailable`, `paused_for`): here, not in
# the client, so what reads the figures (status, the console) does not import the client
DOWN = "down"
AUTH = "auth"  # it refuses our API key (401) or what the key may do (403)
# it fails every request for good (a wrong served model name: 404 to everything): no new
# requests for a while, running ones go on (streams/generate/blame.py, rule 4)
REFUSING = "refusing"


def _is_auth(paused_for: str) -> float:
    return 1.0 if paused_for == AUTH else 0.0


@dataclass
class GenerateStats:
    in_flight: int = figure("draftgen_generate_in_flight", "requests in flight", "gauge")
    paused: bool = figure(
        "draftgen_generate_paused", "1 while the worker is paused", "gauge", default=False
    )
    # why: DOWN (the server does not answer) or AUTH (it refuses the API key); "" when running
    paused_for: str = figure(
        "draftgen_generate_paused_auth",
        "1 while paused because the server refuses the API key",
        "gauge",
        key="paused_auth",
        default="",
        value=_is_auth,
    )
    refusing: bool = figure(
        "draftgen_generate_refusing",
        "1 while the server fails every request for good (no new requests go to it)",
        "gauge",
        default=False,
    )
    # counted by the timed client around each request (streams/generate/timed.py)
    requests: int = figure("draftgen_generate_requests", "requests sent, retries included")
    completed: int = figure("draftgen_generate_completed", "completions produced")
    dead_letters: int = figure("draftgen_generate_dead_letters", "prompts dead-lettered")
    retries: int = figure("draftgen_generate_retries", "requests retried after a transient error")
    output_tokens: int = figure("draftgen_generate_output_tokens", "completion tokens generated")
    errors: dict[str, int] = field(
        default_factory=dict,
        metadata=figured(
            Figure("", "draftgen_generate_errors", "failed requests, by kind", by_kind=True)
        ),
    )
    # prompts acked without a request, because the ledger had them (streams/generate/once.py)
    skipped: int = figure("draftgen_generate_skipped", "prompts skipped: already generated")
    # claims won before a request (every request is claimed: streams/generate/claims.py);
    # prompts whose claim by another worker was waited for instead of asking the server
    claimed: int = figure("draftgen_generate_claimed", "claims won: one before each request")
    awaited: int = figure("draftgen_generate_awaited", "prompts awaited: claimed by another")
    # prompts generated from other workers' backlogs (streams/generate/steal.py)
    stolen: int = figure("draftgen_generate_stolen", "prompts generated from others' backlogs")
    # deliveries its partition's lease refused, unacked (streams/core/leases.py): delivered
    # before a revocation, delivered again, or past a record not delivered (sought back to it)
    refused: int = figure("draftgen_generate_refused", "deliveries refused by a partition lease")
    # how its server returns exact token ids, once asked (`ids_note`); "" before
    exact_ids: str = note()


_PAUSED = figure_of(GenerateStats, lambda s: s.paused)


def generate_figures(stats: GenerateStats, unreachable: bool = False) -> Figures:
    """`unreachable`: the server has not answered since the worker started (it waits)."""
    figures = read_figures(stats)
    if unreachable:
        figures.gauges[_PAUSED.key] = 1.0
    return figures
