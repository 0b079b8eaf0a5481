"""`draftgen run`'s console lines, from the workers' heartbeats: one line per change."""

from __future__ import annotations

from streams.generate.stats import GenerateStats, generate_figures
from streams.observe.heartbeat import Heartbeat
from streams.tools.console import ConsoleWatch
from streams.tools.status_view import server_rows

SERVER = "http://gpu-01:30000"
NOW = 1_000_000.0


def beat(
    pid: int,
    at: float = NOW,
    *,
    paused: bool = False,
    auth: bool = False,
    refusing: bool = False,
    ids: str = "",
    role: str = "generate",
    label: str = SERVER,
) -> Heartbeat:
    return Heartbeat(
        role=role,
        label=label,
        worker=f"{role}|{label}|host|{pid}",
        time=at,
        interval_s=5.0,
        started_at=at - 1.0,
        gauges={
            "paused": float(paused or auth or refusing),
            "paused_auth": float(auth),
            "refusing": float(refusing),
        },
        notes={"exact_ids": ids} if ids else {},
        pid=pid,
    )


def beats(*items: Heartbeat) -> dict[str, Heartbeat]:
    return {b.worker: b for b in items}


def test_a_server_that_does_not_answer_is_said_once_and_so_is_its_return() -> None:
    watch = ConsoleWatch()
    [down] = watch.lines(beats(beat(1, paused=True)), NOW)
    assert down.startswith(f"server {SERVER} is not answering")
    assert watch.lines(beats(beat(1, NOW + 5, paused=True)), NOW + 5) == []
    ids = "exact via sglext.input_ids + sglext.output_ids (sglext)"
    back, way = watch.lines(beats(beat(1, NOW + 10, ids=ids)), NOW + 10)
    assert back.startswith(f"server {SERVER} is answering again")
    assert way == f"server {SERVER}: token ids {ids}"
    assert watch.lines(beats(beat(1, NOW + 15, ids=ids)), NOW + 15) == []


def test_a_server_that_fails_every_request_for_good_is_said_and_shown_refusing() -> None:
    """A node answering 404 to everything (blame.py, rule 4): its own line on the console, and
    `status` shows it paused for that reason, not as down."""
    watch = ConsoleWatch()
    [refusing] = watch.lines(beats(beat(1, refusing=True)), NOW)
    assert refusing.startswith(f"server {SERVER} fails every request for good")
    assert "dead-letters none" in refusing and "served model name" in refusing
    [row] = server_rows([beat(1, refusing=True)], NOW)
    assert row.paused and row.paused_for == "refusing"
    [back] = watch.lines(beats(beat(1, NOW + 60)), NOW + 60)
    assert back.startswith(f"server {SERVER} is answering again")


def test_a_refused_api_key_and_a_server_without_exact_ids_are_said() -> None:
    watch = ConsoleWatch()
    [auth] = watch.lines(beats(beat(1, auth=True)), NOW)
    assert "refuses the API key" in auth and "DRAFTGEN_API_KEY" in auth
    _, rendered = watch.lines(beats(beat(1, ids="none: samples rendered")), NOW)
    assert "not token-exact" in rendered and "--api native" in rendered


def test_a_worker_that_stops_reporting_and_its_restart_are_said() -> None:
    watch = ConsoleWatch()
    assert watch.lines(beats(beat(1)), NOW) == []
    later = NOW + 60  # three beats missed
    [silent] = watch.lines(beats(beat(1)), later)
    assert f"generate worker (pid 1) of server {SERVER} has not reported" in silent
    [restart] = watch.lines(beats(beat(1), beat(2, later)), later)
    assert "generate worker (pid 2)" in restart and "a restart" in restart
    # a second worker joining a live one is not a restart
    assert watch.lines(beats(beat(1), beat(2, later), beat(3, later)), later) == []


def test_a_server_unreachable_since_start_is_paused_in_heartbeats_and_status() -> None:
    figures = generate_figures(GenerateStats(), unreachable=True)
    assert figures.gauges["paused"] == 1.0
    stats = GenerateStats(exact_ids="exact via token_ids (vllm)")
    assert generate_figures(stats).notes == {"exact_ids": "exact via token_ids (vllm)"}
    [row] = server_rows([beat(1, paused=True, ids="exact via token_ids (vllm)")], NOW)
    assert (row.paused, row.paused_for, row.exact_ids) == (
        True,
        "down",
        "exact via token_ids (vllm)",
    )
