"""The join storm of issue 31, shared by its CI test (tests/integration/test_join_storm.py, a
few hundred prompts) and its benchmark (tests/benchmarks/bench_join_storm.py, 1,000 prompts,
several runs).

The scenario: one generate worker holds every partition of `prompts` with requests in flight;
three more join 1, 3 and 5 s after the publish; then one leaves by SIGTERM and is replaced, one
is killed -9 and restarted, and another is replaced. Each of those three comes once its worker
has requests in flight (a worker takes seconds to start on a busy machine; one stopped before it
joined moves nothing): the first replacement once a share of the prompts is committed by the
group (`StormPlan.replace_b_at`), the kill -9 just after the rebalance of that replacement's
join, while prompts the killed worker had in flight before it still run, the last replacement
right after. Workers a and c are static group members (the default): c's restart takes its
place and partitions without a rebalance and resumes from the group's committed offsets; b and d
are dynamic (`--no-static-membership`), so their SIGTERMs move partitions (the claims path: the
new owners wait for the requests the old owner finishes). A batch of prompts is published just
before c's kill and another before d's replacement: by then their own partitions may be drained
(how fast is the machine's to say), and prompts arriving on every partition give them requests in
flight. So prompts are in flight at every change whatever the machine's speed. Each worker slot
has its own emulated SGLang server, slow enough that many requests are in flight, answering some
of them 500 or 503 or cutting the connection, and logging every request (`--request-log`,
compose/emulator/request_log.py).

Then it waits for "nothing left": the group's committed offsets at the topic's ends (lag 0) and
every prompt with an outcome, or lag 0 for `settle_s` with prompts still missing (no worker will
take them up again: they are lost), within `timeout_s`.

The audit reads the topics with group-less readers, never the workers' counts: the prompts
(id, partition@offset), the completions, the dead letters and the `generated` ledger. From the
servers' request logs it counts the prompts requested more than once and the successful
generations thrown away (answered whole, no completion kept for them).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from compose.emulator.request_log import prompt_digest
from compose.process import ManagedProcess, stop_together
from compose.stack import LocalStack
from producers.publish import publish
from producers.sources import parse_source_spec
from streams.core.ledger import CLAIM, DEAD, split_key
from streams.core.records import CompletionRecord, DeadLetter, PromptRecord
from streams.core.settings import (
    COMPLETIONS,
    DEAD_LETTERS,
    GENERATE_GROUP,
    GENERATED,
    PROMPTS,
    KafkaSettings,
)
from streams.core.topic_reader import TopicReader
from tests.benchmarks.workers import generate_argv
from tests.integration.probes import emulator_stats, group_lag, log_lines, stable_members
from tests.polling import wait_for

SLOTS = ("a", "b", "c", "d")
# faust's line, in a worker's log, once the group gave it its partitions
ASSIGNED = r"Executing _on_partitions_assigned"
# what the servers do wrong, per request: a full queue's 503, a 500 after some decoding, an
# answer cut off in the middle (connection reset), and a prompt too long for the context (a
# dead letter: the other outcome)
FAULTS = (
    "--fail-503-rate",
    "0.03",
    "--fail-500-rate",
    "0.03",
    "--drop-rate",
    "0.02",
    "--fail-400-rate",
    "0.01",
)


@dataclass(frozen=True)
class StormPlan:
    prompts: int = 400
    # published twice more: before c is killed and before d is replaced, each once it has
    # requests in flight
    late_prompts: int = 100
    # static group members (the default); the others run with --no-static-membership
    static: tuple[str, ...] = ("a", "c")
    partitions: int = 16
    concurrency: int = 16
    # each server's decode speed and output lengths (log-normal around the mean, up to the
    # max): 2.3 s a request on average, a long tail of requests that outlive a rebalance
    tokens_per_s: float = 60.0
    mean_output_tokens: int = 140
    max_output_tokens: int = 600
    # seconds after the publish at which workers b, c and d join
    joins_s: tuple[float, ...] = (1.0, 3.0, 5.0)
    # b leaves by SIGTERM and is replaced once this share of the prompts is committed by the
    # group and b has requests in flight; d right after c's restart and the late prompts, once
    # it has requests in flight
    replace_b_at: float = 0.15
    # c is killed -9 (and restarted) this long after b's replacement started requesting
    kill_after_rebalance_s: float = 2.0
    # from the publish until nothing is left
    timeout_s: float = 150.0
    # lag 0 for this long with prompts missing: they are lost, stop waiting
    settle_s: float = 10.0
    # the workers' --claim-s (None: the default, 15 s): how long the new owners of a killed
    # worker's claimed prompts wait before asking their own servers
    claim_s: float | None = None


@dataclass
class Incarnation:
    """One generate worker process of a slot (a slot's server outlives its workers)."""

    slot: str
    number: int
    process: ManagedProcess
    started: float  # wall clock, as the request logs
    ended: float | None = None
    how: str = ""

    @property
    def name(self) -> str:
        return f"gen-{self.slot}#{self.number} (pid {self.process.pid})"


@dataclass(frozen=True)
class Request:
    slot: str
    start: float
    end: float
    outcome: str  # compose/emulator/request_log.py: ok, cut, reset, http_N, gone


@dataclass
class Audit:
    """What the topics and the servers' request logs say about every published prompt."""

    where: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> partition, offset
    completions: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    ledger_generated: set[str] = field(default_factory=set)
    ledger_dead: set[str] = field(default_factory=set)
    requests: dict[str, list[Request]] = field(default_factory=lambda: defaultdict(list))
    unknown_requests: int = 0  # requests naming no published prompt (the start-up probes)
    digests: dict[str, str] = field(default_factory=dict)  # prompt_digest -> prompt id

    @property
    def missing(self) -> list[str]:
        """Published prompts with no outcome at all: lost."""
        return sorted(p for p in self.where if not self.completions[p] and not self.dead_letters[p])

    @property
    def both_kinds(self) -> list[str]:
        return sorted(p for p in self.where if self.completions[p] and self.dead_letters[p])

    @property
    def duplicates(self) -> int:
        """Outcome records beyond one a prompt (at-least-once; the tokenize stage dedups)."""
        return sum(max(0, self.completions[p] + self.dead_letters[p] - 1) for p in self.where)

    @property
    def ledger_without_outcome(self) -> list[str]:
        """Ledger marks whose outcome is not on its topic: `publish` would skip such a prompt
        for ever."""
        return sorted(
            {p for p in self.ledger_generated if not self.completions[p]}
            | {p for p in self.ledger_dead if not self.dead_letters[p]}
        )

    def _ok(self, prompt: str) -> int:
        return sum(r.outcome == "ok" for r in self.requests.get(prompt, []))

    @property
    def requested_more_than_once(self) -> int:
        return sum(len(self.requests.get(p, [])) > 1 for p in self.where)

    @property
    def successful(self) -> int:
        """Whole answers the servers gave (a generation done and delivered)."""
        return sum(self._ok(p) for p in self.where)

    @property
    def thrown_away(self) -> int:
        """Whole answers beyond the completions kept of their prompt."""
        return sum(max(0, self._ok(p) - self.completions[p]) for p in self.where)

    @property
    def redone(self) -> int:
        """Whole answers beyond the first of their prompt."""
        return sum(max(0, self._ok(p) - 1) for p in self.where)

    @property
    def completed_unrequested(self) -> list[str]:
        """Completions no server logged a whole answer for: the request logs are not
        trustworthy then (the digest of what the worker sent differs from ours)."""
        return sorted(p for p in self.where if self.completions[p] and not self._ok(p))


@dataclass
class StormResult:
    plan: StormPlan
    audit: Audit
    incarnations: list[Incarnation]
    # (seconds after the publish, what happened, the group's lag then)
    events: list[tuple[float, str, int]]
    lag: int  # at the end
    wall_s: float  # from the publish until nothing was left (or the wait gave up)
    peak_running: dict[str, int]  # requests in flight at once, per server
    started: float  # wall clock of the publish

    @property
    def lost(self) -> int:
        return len(self.audit.missing)

    def line(self) -> str:
        a = self.audit
        return (
            f"prompts {len(a.where)}, lost {self.lost}, duplicates {a.duplicates}, "
            f"dead letters {sum(1 for p in a.where if a.dead_letters[p])}, "
            f"both kinds {len(a.both_kinds)}, "
            f"requested more than once {a.requested_more_than_once}, "
            f"successful generations {a.successful}, thrown away {a.thrown_away}, "
            f"redone {a.redone}, lag {self.lag}, wall {self.wall_s:.1f}s"
        )

    def timeline(self) -> str:
        return timeline(self.events)

    def requesters(self, prompt: str) -> str:
        """Who asked a server for `prompt`, when, and how each request ended."""
        asked = self.audit.requests.get(prompt, [])
        if not asked:
            return "never requested"
        return "; ".join(
            f"{self._worker_at(r.slot, r.start)} at +{r.start - self.started:.1f}s "
            f"({r.outcome} after {r.end - r.start:.1f}s)"
            for r in sorted(asked, key=lambda r: r.start)
        )

    def missing_report(self) -> str:
        lines = []
        for prompt in self.audit.missing:
            partition, offset = self.audit.where[prompt]
            lines.append(f"  {prompt} at {partition}@{offset}: {self.requesters(prompt)}")
        return "\n".join(lines)

    def report(self) -> str:
        parts = [self.line(), "timeline:", self.timeline()]
        if self.audit.missing:
            parts += [f"lost ({self.lost}):", self.missing_report()]
        if self.audit.both_kinds:
            parts.append(f"a completion and a dead letter ({len(self.audit.both_kinds)}):")
            parts += [f"  {p}: {self.requesters(p)}" for p in self.audit.both_kinds]
        exits = ", ".join(f"{i.name}: {i.how}" for i in self.incarnations if i.how)
        parts.append(f"workers: {exits}")
        parts.append(f"peak requests in flight per server: {self.peak_running}")
        return "\n".join(parts)

    def _worker_at(self, slot: str, moment: float) -> str:
        for inc in self.incarnations:
            if inc.slot == slot and inc.started <= moment and (inc.ended or moment) >= moment:
                return inc.name
        return f"gen-{slot}"


def timeline(events: list[tuple[float, str, int]]) -> str:
    return "\n".join(f"  +{at:5.1f}s {what} (lag {lag})" for at, what, lag in events)


class JoinStorm:
    """One storm on a running Kafka: its own topics (`prefix`), servers and workers, all
    started through `stack` and stopped by PID when `run` returns, however it returns."""

    def __init__(
        self,
        stack: LocalStack,
        bootstrap: str,
        tokenizer_dir: Path,
        workdir: Path,
        prefix: str,
        plan: StormPlan | None = None,
        env: dict[str, str] | None = None,
        say: Callable[[str], None] = lambda _line: None,
    ) -> None:
        self.stack = stack
        self.plan = plan or StormPlan()
        self.tokenizer_dir = tokenizer_dir
        self.workdir = workdir
        self.kafka = KafkaSettings(
            bootstrap=bootstrap, topic_prefix=prefix, partitions=self.plan.partitions
        )
        # a killed worker holds its partitions until its session times out
        self.env = {"DRAFTGEN_KAFKA_SESSION_TIMEOUT_S": "10", **(env or {})}
        self.say = say
        self.servers: dict[str, tuple[str, ManagedProcess]] = {}
        self.workers: dict[str, Incarnation] = {}
        self.incarnations: list[Incarnation] = []
        self.events: list[tuple[float, str, int]] = []
        self.t0 = 0.0

    # -- the scenario --------------------------------------------------------------------------

    def run(self) -> StormResult:
        try:
            return self._run()
        except AssertionError as err:  # a wait of the scenario timed out: say where it was
            raise AssertionError(f"{err}\n{self._where()}") from None
        finally:
            self._stop()

    def _run(self) -> StormResult:
        plan = self.plan
        self.workdir.mkdir(parents=True, exist_ok=True)
        for slot in SLOTS:
            self.servers[slot] = self.stack.start_emulator_process(
                self.tokenizer_dir,
                "--tokens-per-s",
                str(plan.tokens_per_s),
                "--mean-output-tokens",
                str(plan.mean_output_tokens),
                "--max-output-tokens",
                str(plan.max_output_tokens),
                "--seed",
                str(SLOTS.index(slot)),
                "--request-log",
                str(self._request_log(slot)),
                *FAULTS,
                name=f"emulator-{slot}",
            )
        self._start("a")
        wait_for(
            lambda: asyncio.run(stable_members(self.kafka, GENERATE_GROUP)) == 1,
            120,
            "the first generate worker to hold every partition",
        )
        self._publish("prompts.jsonl", range(plan.prompts))
        self.t0 = time.monotonic()
        started = time.time()
        server_a = self.servers["a"][0]
        wait_for(
            lambda: emulator_stats(server_a)["running"] >= plan.concurrency // 2,
            60,
            "requests in flight on the first worker's server",
        )
        self._event("gen-a holds every partition, requests in flight")
        for slot, at in zip(SLOTS[1:], plan.joins_s, strict=True):
            self._at(at)
            self._start(slot)
            self._event(f"gen-{slot} started (joins)")
        self._when_busy("b", plan.replace_b_at)
        self._replace("b", kill=False)
        # c dies just after the rebalance of b's replacement joining: prompts it had in flight
        # before it still run, those redelivered to it are being acked
        self._when_assigned("b")
        self._event("gen-b's replacement has its partitions (its join's rebalance is done)")
        self._publish_late(1)
        self._when_busy("c", None)
        self._at(time.monotonic() - self.t0 + plan.kill_after_rebalance_s)
        self._replace("c", kill=True)
        self._publish_late(2)
        self._when_busy("d", None)
        self._replace("d", kill=False)
        lag = self._wait_nothing_left()
        wall = time.monotonic() - self.t0
        peaks = {
            slot: int(emulator_stats(url)["peak_running"])
            for slot, (url, _) in self.servers.items()
        }
        for inc in self.workers.values():
            inc.how = "running" if inc.process.alive() else f"exited {self._exit_code(inc)}"
        audit = self.audit()
        return StormResult(plan, audit, self.incarnations, self.events, lag, wall, peaks, started)

    def _where(self) -> str:
        """The timeline, then what each server and worker is doing now (for a timed-out wait)."""
        lines = [f"timeline:\n{timeline(self.events)}", f"lag now: {self._lag()}"]
        for slot, (url, _) in self.servers.items():
            stats = emulator_stats(url)
            lines.append(
                f"server {slot}: running {stats.get('running')}, requests "
                f"{stats.get('requests')}, completed {stats.get('completed')}"
            )
        for inc in self.workers.values():
            state = "running" if inc.process.alive() else "exited"
            lines.append(f"{inc.name} ({state}), its log's end:\n{inc.process.tail(15)}")
        return "\n".join(lines)

    def _at(self, seconds: float) -> None:
        # the scenario's clock (joins "a few seconds apart"), not a synchronisation
        time.sleep(max(0.0, self.t0 + seconds - time.monotonic()))

    def _lag(self) -> int:
        return group_lag(self.kafka, GENERATE_GROUP, PROMPTS)

    def _event(self, what: str) -> None:
        lag = self._lag()
        at = time.monotonic() - self.t0
        self.events.append((at, what, lag))
        self.say(f"+{at:5.1f}s {what} (lag {lag})")

    def _when_busy(self, slot: str, share: float | None) -> None:
        """Until `share` of the prompts is committed (if given) and the slot's worker has
        requests in flight (a worker still starting up holds no partitions: stopping it moves
        nothing)."""
        if share is not None:
            left = int(self.plan.prompts * (1 - share))
            wait_for(
                lambda: self._lag() <= left,
                self.plan.timeout_s,
                f"{share:.0%} of the prompts committed by the generate group",
            )
        url = self.servers[slot][0]
        busy = max(1, self.plan.concurrency // 4)
        wait_for(
            lambda: emulator_stats(url)["running"] >= busy,
            self.plan.timeout_s,
            f"gen-{slot} to have {busy} requests in flight",
        )

    def _when_assigned(self, slot: str) -> None:
        """Until the slot's worker was given its partitions (the rebalance of its join done)."""
        process = self.workers[slot].process
        wait_for(
            lambda: log_lines(process, ASSIGNED),
            self.plan.timeout_s,
            f"gen-{slot} to be assigned its partitions",
        )

    def _start(self, slot: str) -> Incarnation:
        url = self.servers[slot][0]
        process = self.stack.start_worker(
            f"gen-{slot}",
            generate_argv(
                url,
                self.kafka,
                self.plan.concurrency,
                *([] if slot in self.plan.static else ["--no-static-membership"]),
                *([] if self.plan.claim_s is None else ["--claim-s", str(self.plan.claim_s)]),
            ),
            env=self.env,
        )
        number = sum(inc.slot == slot for inc in self.incarnations) + 1
        inc = Incarnation(slot, number, process, time.time())
        self.incarnations.append(inc)
        self.workers[slot] = inc
        return inc

    def _replace(self, slot: str, kill: bool) -> None:
        """SIGTERM (waiting for it to leave) or kill -9, then a new worker on the server."""
        inc = self.workers[slot]
        if kill:
            inc.process.kill()
            inc.how = "kill -9"
        else:
            inc.process.stop()
            inc.how = f"SIGTERM, exited {self._exit_code(inc)}"
        inc.ended = time.time()
        self._event(f"{inc.name} {'killed -9' if kill else 'left (SIGTERM)'}")
        self._start(slot)
        self._event(f"gen-{slot} {'restarted' if kill else 'replaced'}")

    @staticmethod
    def _exit_code(inc: Incarnation) -> int | None:
        return inc.process.popen.returncode if inc.process.popen else None

    def _wait_nothing_left(self) -> int:
        """Until lag 0 and every prompt has an outcome, or lag 0 for `settle_s` (what is
        missing then stays missing), or the timeout; returns the last lag seen."""
        deadline = self.t0 + self.plan.timeout_s
        drained_since: float | None = None
        lag = self._lag()
        while time.monotonic() < deadline:
            lag = self._lag()
            if lag == 0:
                drained_since = drained_since or time.monotonic()
                if not self.audit().missing:
                    break
                if time.monotonic() - drained_since >= self.plan.settle_s:
                    break
            else:
                drained_since = None
            time.sleep(1.0)  # a poll interval: each look reads the group's offsets
        self._event("nothing left" if lag == 0 else "gave up waiting")
        return lag

    def _stop(self) -> None:
        stop_together([inc.process for inc in self.workers.values()])
        stop_together([process for _, process in self.servers.values()])

    # -- prompts and the audit -----------------------------------------------------------------

    def _publish_late(self, batch: int) -> None:
        start = self.plan.prompts + (batch - 1) * self.plan.late_prompts
        self._publish(f"late-{batch}.jsonl", range(start, start + self.plan.late_prompts))
        self._event(f"{self.plan.late_prompts} more prompts published")

    def _publish(self, name: str, indexes: range) -> None:
        path = self._write_prompts(name, indexes)
        summary = asyncio.run(publish(self.kafka, [parse_source_spec(str(path))], progress=False))
        assert summary.published == len(indexes), summary.line()

    def _write_prompts(self, name: str, indexes: range) -> Path:
        path = self.workdir / name
        with path.open("wb") as handle:
            for index in indexes:
                messages = [
                    {"role": "user", "content": f"[{index}] Explain step {index} of the plan."}
                ]
                if index % 3 == 0:
                    messages.insert(
                        0, {"role": "system", "content": f"You are assistant #{index}."}
                    )
                handle.write(orjson.dumps({"messages": messages}) + b"\n")
        return path

    def _request_log(self, slot: str) -> Path:
        return self.workdir / f"requests-{slot}.jsonl"

    def audit(self) -> Audit:
        audit = asyncio.run(read_topics(self.kafka))
        for slot in SLOTS:
            path = self._request_log(slot)
            if not path.exists():
                continue
            for raw in path.read_bytes().splitlines():
                line = orjson.loads(raw)
                prompt = audit.digests.get(line["prompt"])
                if prompt is None:
                    audit.unknown_requests += 1
                    continue
                audit.requests[prompt].append(
                    Request(slot, line["start"], line["end"], line["outcome"])
                )
        return audit


async def read_topics(kafka: KafkaSettings) -> Audit:
    """The prompts, completions, dead letters and ledger, each read whole by a group-less
    reader."""
    audit = Audit()

    def prompt(record: Any) -> None:
        decoded = PromptRecord.decode(record.value)
        audit.where[decoded.prompt_id] = (record.partition, record.offset)
        audit.digests[prompt_digest(decoded.messages)] = decoded.prompt_id

    def completion(record: Any) -> None:
        audit.completions[CompletionRecord.decode(record.value).prompt_id] += 1

    def dead_letter(record: Any) -> None:
        letter = DeadLetter.decode(record.value)
        if letter.prompt_id:
            audit.dead_letters[letter.prompt_id] += 1

    def ledger(record: Any) -> None:
        key = record.key.decode()
        if key.endswith(CLAIM):
            return  # a request running for a revoked prompt: no outcome
        if key.endswith(DEAD):
            audit.ledger_dead.add(split_key(key.removesuffix(DEAD))[0])
        else:
            audit.ledger_generated.add(split_key(key)[0])

    for topic, handle in (
        (PROMPTS, prompt),
        (COMPLETIONS, completion),
        (DEAD_LETTERS, dead_letter),
        (GENERATED, ledger),
    ):
        reader = TopicReader(kafka, kafka.topic(topic))
        try:
            if await reader.open():
                await reader.read_to_end(handle)
        finally:
            await reader.close()
    return audit
