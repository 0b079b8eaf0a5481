"""Issue 38's scenarios, "a dead or slow server costs only its own requests", shared by their CI
tests (tests/integration/test_work_distribution.py, small) and their benchmark
(tests/benchmarks/bench_work_distribution.py, large):

- `kill_server`: one of the servers killed -9 mid-run, its worker left running; later a SIGTERM
  to that worker;
- `pause_server`: one server stopped (SIGSTOP) for a while, then resumed (SIGCONT);
- `long_tail`: most answers short, some very long (the emulator's --long-fraction);
- `zombie_worker`: one generate worker stopped longer than its Kafka session with requests in
  flight, then resumed.

A `Fleet` is one emulated server per generate worker (`--request-log` each, the same seed, so a
prompt's answer takes as long on any of them), all joined and idle before the prompts are
published. Each scenario returns a `ScenarioResult`: the outcomes read from the topics
(join_storm.read_topics: lost, duplicates), the figures from the request logs
(tests/work_analysis.py: redone, overlaps, idle healthy slot-seconds, finish against best),
its timeline and its own measures (seconds to finish after the kill, to exit after SIGTERM…).
The scenarios do not assert: a timed-out wait is recorded (a stall is a figure of the
benchmark), the tests assert on the result.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from compose.children import signal_group
from compose.process import ManagedProcess, stop_together
from compose.stack import LocalStack
from producers.publish import publish
from producers.sources import parse_source_spec
from streams.core.ledger import LedgerFollower, split_key
from streams.core.settings import GENERATE_GROUP, PROMPTS, KafkaSettings
from tests.benchmarks.join_storm import Audit, read_topics
from tests.benchmarks.workers import generate_argv
from tests.integration.probes import emulator_stats, group_lag, stable_members
from tests.polling import wait_for
from tests.work_analysis import (
    Outage,
    Overlap,
    Request,
    WorkFigures,
    overlaps,
    read_request_log,
    work_figures,
)


@dataclass(frozen=True)
class FleetPlan:
    servers: int = 4
    prompts: int = 240
    partitions: int = 8
    concurrency: int = 16  # each worker's requests in flight: its server's slots
    # decode speed and output lengths: uniform in [min, max] tokens, ~2.3 s a request at 60/s
    tokens_per_s: float = 60.0
    min_output_tokens: int = 16
    max_output_tokens: int = 256
    # a long tail on top (compose/emulator/settings.py): this share of prompts gets A-B tokens
    long_fraction: float = 0.0
    long_output_tokens: str = "3000-6000"
    worker_args: tuple[str, ...] = ()
    # more emulator flags for every server, and for some by name (a fault of one node)
    server_args: tuple[str, ...] = ()
    node_args: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # more environment for some workers, by name (a skewed clock: libfaketime)
    worker_env: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()


@dataclass
class ScenarioResult:
    name: str
    plan: FleetPlan
    audit: Audit
    figures: WorkFigures
    events: list[tuple[float, str]]  # (seconds after the publish, what happened)
    measures: dict[str, Any] = field(default_factory=dict)
    overlaps: list[Overlap] = field(default_factory=list)  # not excused
    requests: list[Request] = field(default_factory=list)
    tails: str = ""  # the workers' log ends and the servers' state, when something failed

    @property
    def lost(self) -> list[str]:
        return self.audit.missing

    def line(self) -> str:
        extra = ", ".join(f"{k} {_show(v)}" for k, v in self.measures.items())
        return (
            f"{self.name}: without an outcome {len(self.lost)}, "
            f"duplicates {self.audit.duplicates}, "
            f"{self.figures.line()}" + (f", {extra}" if extra else "")
        )

    def report(self) -> str:
        parts = [self.line(), "timeline:"]
        parts += [f"  +{at:6.1f}s {what}" for at, what in self.events]
        if self.lost:
            parts.append(f"without an outcome ({len(self.lost)}): {', '.join(self.lost[:20])}")
        if self.overlaps:
            parts.append(f"overlapping requests ({len(self.overlaps)}):")
            parts += [f"  {o}" for o in self.overlaps[:10]]
        if self.tails:
            parts.append(self.tails)
        return "\n".join(parts)

    def as_json(self) -> dict[str, Any]:
        return {
            "scenario": self.name,
            "prompts": self.figures.prompts,
            "lost": len(self.lost),
            "duplicates": self.audit.duplicates,
            "requested_more_than_once": self.figures.requested_more_than_once,
            "redone": self.figures.redone,
            "overlaps": self.figures.overlaps,
            "excused_overlaps": self.figures.excused_overlaps,
            "idle_slot_s": round(self.figures.idle_slot_s, 1),
            "finish_s": round(self.figures.finish_s, 1),
            "best_s": round(self.figures.best_s, 1),
            **self.measures,
        }


def _show(value: Any) -> str:
    if isinstance(value, list):  # prompt ids: how many, and the first few
        return f"{len(value)} {value[:3]}" if value else "0"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


class Fleet:
    """Servers and generate workers of one scenario on a running Kafka: its own topics
    (`kafka.topic_prefix`); everything it started is stopped (by PID) in `stop`."""

    def __init__(
        self,
        stack: LocalStack,
        kafka: KafkaSettings,
        tokenizer_dir: Path,
        workdir: Path,
        plan: FleetPlan,
        env: dict[str, str] | None = None,
        say: Callable[[str], None] = lambda _line: None,
    ) -> None:
        self.stack = stack
        self.kafka = kafka
        self.tokenizer_dir = tokenizer_dir
        self.workdir = workdir
        self.plan = plan
        # a killed or stopped worker holds its partitions until its session times out
        self.env = {"DRAFTGEN_KAFKA_SESSION_TIMEOUT_S": "10", **(env or {})}
        self.say = say
        self.names = [chr(ord("a") + i) for i in range(plan.servers)]
        self.servers: dict[str, tuple[str, ManagedProcess]] = {}
        self.workers: dict[str, ManagedProcess] = {}
        self.stopped: set[int] = set()  # pids we sent SIGSTOP and no SIGCONT yet
        self.events: list[tuple[float, str]] = []
        self.t0 = time.monotonic()
        self.published_at = 0.0  # wall clock, as the request logs

    # -- starting, and the scenario's clock -----------------------------------------------------

    def start(self) -> None:
        """Every server and worker, and waits for the group to hold them all (so no rebalance
        of a worker joining happens once the prompts are out)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        p = self.plan
        for name in self.names:
            self.start_server(name)
        for name in self.names:
            self.workers[name] = self.stack.start_worker(
                f"gen-{name}",
                generate_argv(self.url(name), self.kafka, p.concurrency, *p.worker_args),
                env={**self.env, **dict(dict(p.worker_env).get(name, ()))},
            )
        wait_for(
            lambda: asyncio.run(stable_members(self.kafka, GENERATE_GROUP)) == p.servers,
            120,
            f"{p.servers} generate workers in a stable group",
            interval=1.0,
        )

    def start_server(self, name: str, port: int | None = None) -> None:
        """`name`'s server (again, on its `port`, after a crash)."""
        p = self.plan
        self.servers[name] = self.stack.start_emulator_process(
            self.tokenizer_dir,
            "--tokens-per-s",
            str(p.tokens_per_s),
            "--min-output-tokens",
            str(p.min_output_tokens),
            "--max-output-tokens",
            str(p.max_output_tokens),
            "--long-fraction",
            str(p.long_fraction),
            "--long-output-tokens",
            p.long_output_tokens,
            "--request-log",
            str(self.request_log(name)),
            *p.server_args,
            *dict(p.node_args).get(name, ()),
            name=f"emulator-{name}",
            port=port,
        )

    def publish(self) -> set[str]:
        path = self.workdir / "prompts.jsonl"
        with path.open("wb") as handle:
            for index in range(self.plan.prompts):
                text = f"[{index}] Explain step {index} of the plan."
                handle.write(orjson.dumps({"messages": [{"role": "user", "content": text}]}))
                handle.write(b"\n")
        self.t0 = time.monotonic()
        self.published_at = time.time()
        summary = asyncio.run(publish(self.kafka, [parse_source_spec(str(path))], progress=False))
        assert summary.published == self.plan.prompts, summary.line()
        self.event(f"{self.plan.prompts} prompts published")
        return set(summary.prompt_ids)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def event(self, what: str) -> None:
        self.events.append((self.now(), what))
        self.say(f"+{self.now():6.1f}s {what}")

    def hold(self, until: float) -> None:
        """The scenario's clock (a pause that lasts N s), not a synchronisation."""
        time.sleep(max(0.0, until - self.now()))

    # -- what is going on -----------------------------------------------------------------------

    def url(self, name: str) -> str:
        return self.servers[name][0]

    def request_log(self, name: str) -> Path:
        return self.workdir / f"requests-{name}.jsonl"

    def running(self, name: str) -> int:
        return int(emulator_stats(self.url(name))["running"])

    def audit(self) -> Audit:
        return asyncio.run(read_topics(self.kafka))

    def claimed_by(self, name: str) -> set[str]:
        """The prompts whose claim in the ledger `name`'s generate worker holds now."""

        async def read() -> set[str]:
            ledger = LedgerFollower(self.kafka)
            try:
                await ledger.start()
                await ledger.caught_up.wait()
                mine = self.url(name) + "#"  # a worker's id in claims: its server URL, then #
                return {
                    split_key(work)[0]
                    for work, claim in ledger.claims.items()
                    if claim.worker.startswith(mine) and claim.holds()
                }
            finally:
                await ledger.stop()

        return asyncio.run(read())

    def missing(self) -> list[str]:
        return self.audit().missing

    def done_share(self) -> float:
        audit = self.audit()
        return 1 - len(audit.missing) / max(1, len(audit.where))

    def when_busy(self, name: str, share: float, timeout: float = 120) -> None:
        """Until `share` of the prompts has an outcome and `name`'s server runs at least half
        its slots (a change then hits requests in flight)."""
        wait_for(lambda: self.done_share() >= share, timeout, f"{share:.0%} of the outcomes")
        half = max(1, self.plan.concurrency // 2)
        wait_for(lambda: self.running(name) >= half, timeout, f"{half} requests running on {name}")

    def wait_done(self, timeout: float) -> float | None:
        """Seconds until every prompt has an outcome, or None at the timeout."""
        started = time.monotonic()
        try:
            wait_for(lambda: not self.missing(), timeout, "every prompt's outcome", interval=1.0)
        except AssertionError:
            return None
        return time.monotonic() - started

    def lag(self) -> int:
        return group_lag(self.kafka, GENERATE_GROUP, PROMPTS)

    # -- signals --------------------------------------------------------------------------------

    def pause(self, process: ManagedProcess) -> None:
        assert process.pid is not None
        signal_group(process.pid, signal.SIGSTOP)
        self.stopped.add(process.pid)

    def resume(self, process: ManagedProcess) -> None:
        assert process.pid is not None
        signal_group(process.pid, signal.SIGCONT)
        self.stopped.discard(process.pid)

    def stop(self) -> None:
        """SIGCONT first (a stopped process handles no SIGTERM), then workers, then servers."""
        for pid in list(self.stopped):
            signal_group(pid, signal.SIGCONT)
        self.stopped.clear()
        stop_together(list(self.workers.values()))
        stop_together([process for _, process in self.servers.values()])

    # -- the result -----------------------------------------------------------------------------

    def requests(self, audit: Audit) -> list[Request]:
        found: list[Request] = []
        for name in self.names:
            found += read_request_log(self.request_log(name), name, audit.digests)[0]
        return found

    def tails(self) -> str:
        lines = []
        for name, (url, process) in self.servers.items():
            if process.pid in self.stopped or not process.alive():
                lines.append(f"server {name}: {'stopped' if process.alive() else 'dead'}")
                continue
            try:
                stats = emulator_stats(url)
            except OSError as err:
                lines.append(f"server {name}: {err}")
                continue
            lines.append(
                f"server {name}: running {stats.get('running')}, requests "
                f"{stats.get('requests')}, completed {stats.get('completed')}"
            )
        for name, process in self.workers.items():
            state = "running" if process.alive() else f"exited {process.popen.returncode}"
            lines.append(f"gen-{name} ({state}), its log's end:\n{process.tail(12)}")
        return "\n".join(lines)

    def result(
        self,
        name: str,
        outages: list[Outage] | None = None,
        excused: Callable[[Overlap], bool] = lambda _o: False,
        measures: dict[str, Any] | None = None,
        end: float | None = None,
    ) -> ScenarioResult:
        audit = self.audit()
        requests = self.requests(audit)
        published = dict.fromkeys(audit.where, self.published_at)
        figures = work_figures(
            requests, published, self.names, self.plan.concurrency, outages or [], excused, end
        )
        mine = [r for r in requests if r.prompt in published]
        result = ScenarioResult(
            name,
            self.plan,
            audit,
            figures,
            self.events,
            measures or {},
            overlaps(mine, excused),
            mine,
        )
        if result.lost or result.overlaps:
            result.tails = self.tails()
        return result


# -- the scenarios ------------------------------------------------------------------------------


def kill_server(
    fleet: Fleet,
    victim: str = "c",
    at_share: float = 0.25,
    finish_timeout_s: float = 30.0,
    sigterm_timeout_s: float = 15.0,
) -> ScenarioResult:
    """kill -9 of `victim`'s server once `at_share` of the prompts has an outcome and it runs
    requests; its worker is left running. Then: how long until every prompt has an outcome
    (None: not within `finish_timeout_s`), and how long its worker takes to exit on SIGTERM
    (None: not within `sigterm_timeout_s`)."""
    fleet.start()
    fleet.publish()
    fleet.when_busy(victim, at_share)
    fleet.servers[victim][1].kill()
    killed = time.time()
    fleet.event(f"server {victim} killed -9 (its worker left running)")
    finished = fleet.wait_done(finish_timeout_s)
    pending = len(fleet.missing())
    fleet.event(
        f"every prompt has an outcome, {finished:.1f}s after the kill"
        if finished is not None
        else f"{pending} prompts without an outcome {finish_timeout_s:.0f}s after the kill"
    )
    stall_end = None if finished is not None else time.time()
    worker = fleet.workers[victim]
    worker.terminate()
    sent = time.monotonic()
    fleet.event(f"SIGTERM to gen-{victim}")
    try:
        wait_for(lambda: not worker.alive(), sigterm_timeout_s, f"gen-{victim} to exit")
        exit_s: float | None = time.monotonic() - sent
        fleet.event(f"gen-{victim} exited {worker.popen.returncode} after {exit_s:.1f}s")
    except AssertionError:
        exit_s = None
        fleet.event(f"gen-{victim} still running {sigterm_timeout_s:.0f}s after SIGTERM")
    return fleet.result(
        "kill",
        outages=[Outage(victim, killed)],
        measures={
            "finished_after_kill_s": finished,
            "pending_at_deadline": pending,
            "lag_at_deadline": fleet.lag() if finished is None else 0,
            "sigterm_exit_s": exit_s,
        },
        end=stall_end,
    )


def pause_server(
    fleet: Fleet,
    victim: str = "c",
    pause_s: float = 20.0,
    at_share: float = 0.25,
    finish_timeout_s: float = 60.0,
) -> ScenarioResult:
    """SIGSTOP to `victim`'s server for `pause_s`, then SIGCONT. Measured: what was left
    without an outcome when it resumed (ideally only what it was running when it stopped: the
    others served the rest meanwhile), and how long the run took after it resumed."""
    fleet.start()
    fleet.publish()
    fleet.when_busy(victim, at_share)
    server = fleet.servers[victim][1]
    running_at_pause = fleet.running(victim)
    fleet.pause(server)
    stopped, paused_at = time.time(), fleet.now()
    fleet.event(f"server {victim} stopped (SIGSTOP), running {running_at_pause}")
    # the others have until the resume to do all the rest; whether they did is the measure
    others_done: float | None = None
    try:
        wait_for(
            lambda: len(fleet.missing()) <= running_at_pause,
            pause_s,
            "every prompt but the stopped server's own",
            interval=1.0,
        )
        others_done = fleet.now() - paused_at
        fleet.event("every prompt but the stopped server's own has an outcome")
    except AssertionError:
        pass
    fleet.hold(paused_at + pause_s)
    left = fleet.missing()
    claimed_by = fleet.claimed_by(victim)
    fleet.resume(server)
    resumed = time.time()
    fleet.event(f"server {victim} resumed (SIGCONT), {len(left)} prompts without an outcome")
    finished = fleet.wait_done(finish_timeout_s)
    fleet.event(
        f"every prompt has an outcome, {finished:.1f}s after the resume"
        if finished is not None
        else f"{len(fleet.missing())} prompts without an outcome after {finish_timeout_s:.0f}s"
    )

    def given_up(overlap: Overlap) -> bool:
        # the first request ran on the stopped server, which does nothing while stopped: its
        # worker's health probe went unanswered, so it gave the prompt back (the server finds
        # its client gone when it resumes)
        return overlap.first.server == victim and overlap.first.start < stopped

    result = fleet.result(
        "pause",
        excused=given_up,
        outages=[Outage(victim, stopped, resumed)],
        measures={
            "pause_s": pause_s,
            "running_at_pause": running_at_pause,
            "others_done_s": others_done,
            "left_at_resume": len(left),
            "finished_after_resume_s": finished,
        },
    )
    # of what was left at the resume, what was not the stopped server's: those it was running
    # when it stopped, and those its worker claimed for it before noticing (two unanswered
    # health probes take up to ~30 s, longer than the CI's pause; the server logs a request
    # sent to it while stopped only once it resumes, so the ledger says whose they were)
    held = {r.prompt for r in result.requests if r.server == victim and r.start < stopped < r.end}
    held |= claimed_by
    result.measures["left_not_on_stopped_server"] = sorted(set(left) - held)
    return result


def long_tail(fleet: Fleet, finish_timeout_s: float = 120.0) -> ScenarioResult:
    """Every prompt at once on a stable group; answers mostly short, a share very long."""
    fleet.start()
    fleet.publish()
    finished = fleet.wait_done(finish_timeout_s)
    fleet.event(
        "every prompt has an outcome"
        if finished is not None
        else f"{len(fleet.missing())} prompts without an outcome after {finish_timeout_s:.0f}s"
    )
    return fleet.result("tail", measures={"finished_s": finished})


def zombie_worker(
    fleet: Fleet,
    victim: str = "c",
    pause_s: float = 20.0,
    at_share: float = 0.25,
    finish_timeout_s: float = 60.0,
) -> ScenarioResult:
    """SIGSTOP to `victim`'s generate worker (its server goes on) for `pause_s`, longer than
    its Kafka session, with requests in flight; then SIGCONT. A request of the stopped worker
    may overlap another server's request of the same prompt once the stopped worker's claim
    can have lapsed: that overlap is excused (counted apart), no other."""
    fleet.start()
    fleet.publish()
    fleet.when_busy(victim, at_share)
    worker = fleet.workers[victim]
    fleet.pause(worker)
    stopped, paused_at = time.time(), fleet.now()
    fleet.event(f"gen-{victim} stopped (SIGSTOP), its server running {fleet.running(victim)}")
    fleet.hold(paused_at + pause_s)
    fleet.resume(worker)
    resumed = time.time()
    fleet.event(f"gen-{victim} resumed (SIGCONT), {len(fleet.missing())} without an outcome")
    finished = fleet.wait_done(finish_timeout_s)
    fleet.event(
        f"every prompt has an outcome, {finished:.1f}s after the resume"
        if finished is not None
        else f"{len(fleet.missing())} prompts without an outcome after {finish_timeout_s:.0f}s"
    )

    def lapsed(overlap: Overlap) -> bool:
        # the first request is the stopped worker's, from before its resume; the second began
        # while it was stopped or after: its claim could not be renewed
        return (
            overlap.first.server == victim
            and overlap.first.start < resumed
            and overlap.second.start >= stopped
        )

    return fleet.result(
        "zombie",
        excused=lapsed,
        measures={
            "pause_s": pause_s,
            "finished_after_resume_s": finished,
            "zombie_alive": worker.alive(),
        },
    )
