"""Soak: continuous ingestion with membership changes (issue 31). Not in CI.

A local stack (Kafka, SeaweedFS), emulated SGLang servers that fail some requests (503, 500,
connections dropped mid-body, a prompt now and then that always gets 400), generate and
tokenize workers. For `--minutes`: a new JSONL source published every `--publish-every-s`, and
every `--change-every-s` one membership change, in turn: a generate worker joins, a tokenize
worker joins, a generate worker is killed -9 (restarted `--restart-after-s` later), the same
for a tokenize worker, a generate worker is stopped with SIGTERM, a tokenize worker too. The
first worker of each stage is never a victim (its RSS spans the soak); the others are chosen at
random, so each stage keeps 2 or 3 workers. Every process's RSS is sampled every
`--sample-every-s`.

At the end: publishing stops; the soak polls `draftgen audit`'s check until every prompt has
an outcome (bounded by `--drain-timeout-s`), then runs `draftgen seal`, `draftgen audit` and
`draftgen export --format parquet` on the version and counts: published prompts without an
outcome (lost), prompt ids twice in the sealed version or the export (duplicates), and
published = samples + recorded drops + generate-stage dead letters. Exit status 1 if anything
is lost or duplicated; the RSS table says which process kinds grew (soak_rss.py).

    flock /tmp/draftgen-heavy.lock .venv/bin/python tests/benchmarks/soak_membership.py \\
        [--minutes 30] [--publish-every-s 180] [--change-every-s 60] [--json-out FILE]

Every process is a child started through compose/stack.py and stopped by its PID, also on
Ctrl-C or an exception.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from compose.process import ManagedProcess, run_tracked
from compose.stack import LocalStack, draftgen_argv
from compose.tiny_tokenizers import build_qwen36_tokenizer
from producers.publish import publish
from producers.sources import parse_source_spec
from sinks.reader import DatasetReader
from sinks.shards import ShardStore
from streams.cli.run import worker_env
from streams.cli.run_wait import exit_line
from streams.core.settings import KafkaSettings
from streams.tools.audit import audit
from streams.tools.dead_letters import read_dead_letters
from tests.benchmarks.process_sampler import Sampler
from tests.benchmarks.soak_rss import HEADER, KindRss, cpu_by_kind, rss_table, traces_of

BUCKET = "soak"
OUT = f"s3://{BUCKET}/out"
DATASET = "soak"
PARTITIONS = 16
GENERATE, TOKENIZE = "generate", "tokenize"
START, JOIN, KILL, SIGTERM = "start", "join", "kill -9", "SIGTERM"
RESTART, EXITED = "restart", "exited"
CHANGES = (JOIN, SIGTERM, "kill")  # "kill -9" splits at its space
# one change a tick, in this order, round and round
CYCLE = (
    (GENERATE, JOIN),
    (TOKENIZE, JOIN),
    (GENERATE, KILL),
    (TOKENIZE, KILL),
    (GENERATE, SIGTERM),
    (TOKENIZE, SIGTERM),
)
# what the emulated servers do wrong, per request (compose/emulator/settings.py)
FAULTS = (
    "--fail-503-rate",
    "0.03",
    "--fail-500-rate",
    "0.02",
    "--drop-rate",
    "0.02",
    "--fail-400-rate",
    "0.005",
)
WORDS = ["stream", "offset", "commit", "broker", "shard", "token", "lease", "prompt", "draft"]


def write_source(path: Path, number: int, count: int, rng: random.Random) -> Path:
    """`count` rows, each unique (the source's number and the row's index are in its text),
    a fifth of them conversations of three turns."""
    with path.open("wb") as handle:
        for index in range(count):
            ask = " ".join(rng.choices(WORDS, k=rng.randint(15, 80)))
            question = f"[source {number} row {index}] Explain: {ask}?"
            if rng.random() < 0.2:
                messages = [
                    {"role": "user", "content": f"[source {number} row {index}] Hello."},
                    {"role": "assistant", "content": "Hello! What would you like to know?"},
                    {"role": "user", "content": question},
                ]
            else:
                messages = [{"role": "user", "content": question}]
            row = {"id": f"s{number}-{index}", "messages": messages}
            handle.write(orjson.dumps(row) + b"\n")
    return path


@dataclass
class Change:
    t_s: float
    stage: str
    kind: str
    name: str
    pid: int | None
    detail: str = ""

    def line(self) -> str:
        return f"[{self.t_s / 60:6.2f} min] {self.stage:<8} {self.kind:<8} {self.name} " + (
            f"(pid {self.pid}) {self.detail}".rstrip()
        )


class Workers:
    """The workers of both stages: who runs, who joins, who is stopped or killed."""

    def __init__(
        self,
        stack: LocalStack,
        argv: Callable[[str, int], list[str]],
        env: dict[str, str],
        clock: Callable[[], float],
        rng: random.Random,
        restart_after_s: float,
        term_grace_s: float,
    ):
        self.stack, self.argv, self.env, self.clock, self.rng = stack, argv, env, clock, rng
        self.restart_after_s = restart_after_s
        self.term_grace_s = term_grace_s
        self.members: dict[str, list[ManagedProcess]] = {GENERATE: [], TOKENIZE: []}
        self.started: Counter[str] = Counter()
        self.pending: list[tuple[float, str, ManagedProcess]] = []  # killed: restart at t
        self.changes: list[Change] = []
        self.kinds: dict[int, str] = {}  # pid → what it is, for the RSS table

    def note(self, stage: str, kind: str, process: ManagedProcess, detail: str = "") -> None:
        change = Change(self.clock(), stage, kind, process.name, process.pid, detail)
        self.changes.append(change)
        if process.pid is not None:
            self.kinds[process.pid] = f"{stage} worker"
        print(change.line(), flush=True)

    def join(self, stage: str, kind: str = JOIN) -> None:
        """A new worker of `stage`; `kind` START for the soak's first ones (not a change)."""
        index = self.started[stage]
        self.started[stage] += 1
        process = self.stack.start_worker(f"{stage}-{index}", self.argv(stage, index), self.env)
        self.members[stage].append(process)
        self.note(stage, kind, process)

    def _victim(self, stage: str) -> ManagedProcess:
        # the first worker stays: one process of each stage lives through the whole soak
        waiting = {id(p) for _, _, p in self.pending}
        running = [p for p in self.members[stage][1:] if p.alive() and id(p) not in waiting]
        if not running:
            raise RuntimeError(f"no {stage} worker to stop besides the first: {self.members}")
        return self.rng.choice(running)

    def change(self, stage: str, kind: str) -> None:
        if kind == JOIN:
            self.join(stage)
            return
        victim = self._victim(stage)
        if kind == KILL:
            victim.kill()
            self.pending.append((self.clock() + self.restart_after_s, stage, victim))
            self.note(stage, KILL, victim, f"restart in {self.restart_after_s:.0f}s")
            return
        begun = time.monotonic()
        victim.stop(grace=self.term_grace_s)
        took = time.monotonic() - begun
        status = victim.popen.returncode if victim.popen is not None else None
        self.members[stage].remove(victim)
        clean = "exited" if status != -9 else f"did not exit in {self.term_grace_s:.0f}s: killed"
        self.note(stage, SIGTERM, victim, f"{clean} (status {status}) after {took:.1f}s")

    def _replace(self, stage: str, old: ManagedProcess, kind: str, detail: str = "") -> None:
        fresh = self.stack.restart(old)
        members = self.members[stage]
        members[members.index(old)] = fresh
        self.note(stage, kind, fresh, detail)

    def restart_due(self, everything: bool = False) -> None:
        now = self.clock()
        due = [entry for entry in self.pending if everything or entry[0] <= now]
        for entry in due:
            self.pending.remove(entry)
            self._replace(entry[1], entry[2], RESTART)

    def check_exits(self) -> None:
        """A worker that exited without being told to is a finding: noted, then restarted."""
        waiting = {id(p) for _, _, p in self.pending}
        for stage, members in self.members.items():
            for process in list(members):
                if not process.alive() and id(process) not in waiting:
                    self.note(stage, EXITED, process, exit_line(process))
                    self._replace(stage, process, RESTART, "after an exit not ours")

    def counts(self) -> Counter[str]:
        """Membership changes by stage and kind (the first workers' start not among them)."""
        return Counter(f"{c.stage} {c.kind}" for c in self.changes if c.kind != START)


@dataclass
class Accounting:
    published: int = 0
    sources: int = 0
    samples: int = 0
    sample_rows: int = 0  # rows in the sealed version (duplicates counted)
    recorded_drops: int = 0
    dead_letters: int = 0  # prompts dead-lettered before the tokenize stage, with no sample
    lost: int = 0
    lost_ids: list[str] = field(default_factory=list)
    duplicates_sealed: int = 0
    exported_rows: int = 0
    duplicates_export: int = 0
    not_published: int = 0  # ids in the version that no source published
    sample_and_drop: int = 0
    audit: dict[str, Any] = field(default_factory=dict)
    seal_line: str = ""
    export_lines: list[str] = field(default_factory=list)

    @property
    def balanced(self) -> bool:
        return self.published == self.samples + self.recorded_drops + self.dead_letters

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.duplicates_sealed == 0
            and self.duplicates_export == 0
            and self.balanced
            and self.not_published == 0
            and self.sample_and_drop == 0
            and self.audit.get("missing") == 0
        )


def count(
    published: set[str], store: ShardStore, kafka: KafkaSettings, export_path: Path
) -> Accounting:
    """From the sealed version, the dead letters and the export: every published prompt
    accounted for once."""
    sealed = store.sealed()
    if sealed is None:
        raise RuntimeError("the version is not sealed")
    ids = DatasetReader(store).table(columns=["prompt_id"])["prompt_id"].to_pylist()
    samples = set(ids)
    dropped = set(sealed.dropped)
    letters = asyncio.run(read_dead_letters(kafka))
    upstream = {x.prompt_id for x in letters if x.prompt_id and x.stage != TOKENIZE}
    dead = upstream - samples - dropped
    exported = pq.read_table(export_path, columns=["prompt_id"])["prompt_id"].to_pylist()
    lost = sorted(published - samples - dropped - dead)
    return Accounting(
        published=len(published),
        samples=len(samples),
        sample_rows=len(ids),
        recorded_drops=len(dropped - samples),
        dead_letters=len(dead),
        lost=len(lost),
        lost_ids=lost[:50],
        duplicates_sealed=len(ids) - len(samples),
        exported_rows=len(exported),
        duplicates_export=len(exported) - len(set(exported)),
        not_published=len((samples | dropped) - published),
        sample_and_drop=len(samples & dropped),
    )


def draftgen(name: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """A draftgen command as a tracked child; its exit status is the caller's to judge."""
    try:
        return run_tracked(name, draftgen_argv(*args), timeout=timeout)
    except subprocess.CalledProcessError as failed:
        return subprocess.CompletedProcess(
            failed.cmd, failed.returncode, failed.output, failed.stderr
        )


def wait_for_outcomes(kafka: KafkaSettings, workers: Workers, timeout_s: float) -> int:
    """Polls the audit until every published prompt has an outcome; returns how many have
    none at the deadline (0: all)."""
    deadline = time.monotonic() + timeout_s
    while True:
        workers.restart_due(everything=True)
        workers.check_exits()
        result = asyncio.run(audit(kafka, listed=0))
        print(f"[{workers.clock() / 60:6.2f} min] drain: {result.summary()}", flush=True)
        if result.complete or time.monotonic() >= deadline:
            return result.missing
        time.sleep(10)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="of publishing and changes")
    parser.add_argument("--publish-every-s", type=float, default=180.0)
    parser.add_argument("--change-every-s", type=float, default=60.0)
    parser.add_argument(
        "--prompts-per-s",
        type=float,
        default=3.0,
        help="a source holds this many prompts per second of --publish-every-s",
    )
    parser.add_argument("--servers", type=int, default=2, help="emulated SGLang servers")
    parser.add_argument("--tokens-per-s", type=float, default=25.0, help="emulated decode speed")
    parser.add_argument("--concurrency", type=int, default=12, help="per generate worker")
    parser.add_argument("--restart-after-s", type=float, default=20.0)
    parser.add_argument("--term-grace-s", type=float, default=30.0)
    parser.add_argument("--sample-every-s", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=180.0, help="before RSS counts")
    parser.add_argument("--drain-timeout-s", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    if args.minutes <= 0 or args.publish_every_s <= 0 or args.change_every_s <= 0:
        parser.error("--minutes, --publish-every-s and --change-every-s must be positive")
    return args


def main() -> int:
    args = parse_args()
    logging.getLogger("aiokafka").setLevel(logging.ERROR)  # a new topic's leader, not yet known
    rng = random.Random(args.seed)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="draftgen-soak-membership-"))
    print(f"soak: work directory {work}", flush=True)
    with LocalStack(work) as stack, Sampler(interval=args.sample_every_s) as sampler:
        clock = sampler.now  # the soak's time is the RSS samples' time
        bootstrap = stack.start_kafka()
        s3 = stack.start_s3()
        s3.create_bucket(BUCKET)
        tokenizer = build_qwen36_tokenizer(work / "tokenizer")
        s3_env = {
            "DRAFTGEN_S3_ENDPOINT_URL": s3.endpoint.endpoint_url,
            "DRAFTGEN_S3_ACCESS_KEY": s3.endpoint.access_key,
            "DRAFTGEN_S3_SECRET_KEY": s3.endpoint.secret_key,
        }
        os.environ.update(s3_env)  # for seal, audit and export, run as children
        env = {**s3_env, **worker_env(work)}
        kafka = KafkaSettings(bootstrap=bootstrap, partitions=PARTITIONS)
        common = ["--bootstrap", bootstrap, "--partitions", str(PARTITIONS)]
        speed = ("--tokens-per-s", str(args.tokens_per_s))
        servers = []
        kinds: dict[int, str] = {}
        for index in range(args.servers):
            url, server = stack.start_emulator_process(
                tokenizer, "--seed", str(index), *speed, *FAULTS, name=f"emulator-{index}"
            )
            servers.append(url)
            kinds[server.pid or 0] = "emulator"
        for service, kind in ((stack.kafka, "kafka"), (stack.s3, "seaweedfs")):
            if service is not None and service.process is not None:
                kinds[service.process.pid or 0] = kind

        def argv(stage: str, index: int) -> list[str]:
            if stage == GENERATE:
                server = servers[index % len(servers)]  # several workers may share a server
                words = ["generate", "--server", server, "--concurrency", str(args.concurrency)]
            else:
                words = ["tokenize", "--tokenizer-dir", str(tokenizer), "--out", OUT]
                words += ["--dataset", DATASET, "--idle-flush", "2"]
            return ["--log-level", "INFO", "worker", *words, *common]

        workers = Workers(stack, argv, env, clock, rng, args.restart_after_s, args.term_grace_s)
        for stage in (GENERATE, GENERATE, TOKENIZE, TOKENIZE):
            workers.join(stage, START)

        # -- ingestion and membership changes ----------------------------------------------
        per_source = max(1, round(args.prompts_per_s * args.publish_every_s))
        published: set[str] = set()
        sources = 0
        steady_from = clock() + args.warmup_s
        end = clock() + args.minutes * 60
        next_publish, next_change, tick = clock(), clock() + args.change_every_s, 0
        while (now := clock()) < end:
            if now >= next_publish:
                path = write_source(work / f"source-{sources}.jsonl", sources, per_source, rng)
                summary = asyncio.run(
                    publish(kafka, [parse_source_spec(str(path))], progress=False)
                )
                published.update(summary.prompt_ids)
                sources += 1
                print(f"[{now / 60:6.2f} min] publish  {path.name}: {summary.line()}", flush=True)
                next_publish += args.publish_every_s
            if now >= next_change:
                workers.change(*CYCLE[tick % len(CYCLE)])
                tick += 1
                next_change += args.change_every_s
            workers.restart_due()
            workers.check_exits()
            time.sleep(max(0.0, min(1.0, end - clock())))
        publishing_ended = clock()

        # -- the end: every prompt's outcome, then the sealed version audited ---------------
        print(f"[{clock() / 60:6.2f} min] publishing stopped; waiting for every outcome")
        missing = wait_for_outcomes(kafka, workers, args.drain_timeout_s)
        outcomes_at = clock()
        sealing = draftgen(
            "seal",
            "seal",
            "--out",
            OUT,
            "--dataset",
            DATASET,
            *common,
            "--timeout",
            "600",
            timeout=700,
        )
        print(sealing.stdout.strip() or sealing.stderr.strip(), flush=True)
        audited = draftgen("audit", "audit", "--json", *common, timeout=300)
        export_path = work / "export.parquet"
        exporting = draftgen(
            "export",
            "export",
            "--out",
            OUT,
            "--dataset",
            DATASET,
            "--format",
            "parquet",
            "--min-loss-run",
            "1",
            "--to",
            str(export_path),
            timeout=600,
        )
        print(exporting.stdout.strip() or exporting.stderr.strip(), flush=True)
        if sealing.returncode != 0 or exporting.returncode != 0:
            print("seal or export failed: see above", file=sys.stderr)
            return 1
        store = ShardStore(OUT, DATASET, s3.endpoint.storage_options())
        figures = count(published, store, kafka, export_path)
        figures.sources = sources
        figures.seal_line = sealing.stdout.strip()
        figures.export_lines = exporting.stdout.strip().splitlines()
        figures.audit = json.loads(audited.stdout) if audited.stdout.strip() else {}
        figures.audit["exit_status"] = audited.returncode
        sampler.sample()
        traces = traces_of(sampler.series, {**kinds, **workers.kinds})
        table = rss_table(traces, (min(steady_from, publishing_ended), publishing_ended))
        cpu = cpu_by_kind(traces)
        wall = clock()
        report(args, figures, workers, table, cpu, missing, publishing_ended, outcomes_at, wall)
        if args.json_out is not None:
            args.json_out.write_text(
                json.dumps(
                    {
                        "args": {k: str(v) for k, v in vars(args).items()},
                        "accounting": asdict(figures),
                        "changes": [asdict(c) for c in workers.changes],
                        "change_counts": dict(workers.counts()),
                        "rss": [row.as_json() for row in table],
                        "cpu_s": {kind: round(v, 1) for kind, v in cpu.items()},
                        "publishing_s": round(publishing_ended, 1),
                        "outcomes_after_s": round(outcomes_at - publishing_ended, 1),
                        "wall_s": round(wall, 1),
                    },
                    indent=2,
                )
            )
        return 0 if figures.ok and missing == 0 else 1


def report(
    args: argparse.Namespace,
    figures: Accounting,
    workers: Workers,
    table: list[KindRss],
    cpu: dict[str, float],
    missing: int,
    publishing_ended: float,
    outcomes_at: float,
    wall: float,
) -> None:
    counts = workers.counts()
    audit_line = (
        f"{figures.audit.get('missing')} of {figures.audit.get('prompts')} without an outcome "
        f"(exit {figures.audit.get('exit_status')})"
    )
    lines = [
        "",
        "== soak: continuous ingestion with membership changes ==",
        f"publishing        {publishing_ended / 60:.1f} min, a source every "
        f"{args.publish_every_s:g}s, a change every {args.change_every_s:g}s",
        f"sources           {figures.sources}",
        f"prompts published {figures.published}",
        f"changes           {sum(n for k, n in counts.items() if k.split()[1] in CHANGES)} "
        "(joins, SIGTERM, kill -9; restarts after a kill and exits not ours listed too): "
        + ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items())),
        f"outcomes          all {outcomes_at - publishing_ended:.0f}s after publishing stopped"
        if missing == 0
        else f"outcomes          {missing} prompts still without one after the drain",
        f"audit             {audit_line}",
        f"seal              {figures.seal_line}",
        f"export            {' / '.join(line.strip() for line in figures.export_lines)}",
        f"samples           {figures.samples} ({figures.sample_rows} rows)",
        f"recorded drops    {figures.recorded_drops}",
        f"dead letters      {figures.dead_letters} (generate stage, no sample)",
        f"balance           published {figures.published} "
        f"{'=' if figures.balanced else '!='} samples + drops + dead letters "
        f"{figures.samples + figures.recorded_drops + figures.dead_letters}",
        f"lost              {figures.lost}" + (f" {figures.lost_ids}" if figures.lost else ""),
        f"duplicates        {figures.duplicates_sealed} in the sealed version, "
        f"{figures.duplicates_export} in the export ({figures.exported_rows} rows)",
        f"wall time         {wall / 60:.1f} min",
        f"CPU, mean cores   {sum(cpu.values()) / wall:.2f}: "
        + ", ".join(f"{kind} {seconds / wall:.2f}" for kind, seconds in cpu.items()),
        "",
        "RSS (MiB) of the longest-lived process of each kind over the steady state "
        f"(after {args.warmup_s:g}s until publishing stopped); max: any process of the kind",
        HEADER,
        *(row.row() for row in table),
        "",
        "OK" if figures.ok and missing == 0 else "FAILED",
    ]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
