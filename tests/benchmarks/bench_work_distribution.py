"""Issue 38's five scenarios at benchmark size: a dead or slow server must cost only its own
requests (tests/benchmarks/work_scenarios.py; their CI tests: test_work_distribution.py).

    flock /tmp/draftgen-heavy.lock .venv/bin/python tests/benchmarks/bench_work_distribution.py \\
        [--scenario kill|pause|tail|zombie|storm|all] [--prompts N] [--json PATH] [--keep]

- kill: one of four servers killed -9 once a quarter of the prompts has an outcome, its worker
  left running; `--kill-deadline-s` later (a stall is the figure: the prompts without an
  outcome then), a SIGTERM to that worker, given `--sigterm-s` to exit;
- pause: one of four servers stopped (SIGSTOP) for `--pause-s` (90), then resumed;
- tail: 85% of answers 64-256 tokens, 15% 3,000-6,000, at 45 tokens/s, four servers;
- zombie: one of four generate workers stopped for `--zombie-pause-s` (45; its Kafka session is
  10 s, a claim 15 s) with requests in flight, then resumed; its server runs 15% of answers of
  1,000-2,000 tokens, so some outlive its session;
- storm: the join storm of issue 31 (tests/benchmarks/join_storm.py) at `--prompts`.

Starts its own Kafka broker (no S3: only the generate stage runs; the sealed output is the CI
tests'). Each scenario has its own topics, servers (16 slots each, the workers' --concurrency)
and workers, stopped when it ends, Ctrl-C included. Per scenario: prompts without an outcome at
the end ("lost"), duplicates (outcome records beyond one a prompt), prompts requested more than
once, whole answers redone, overlapping requests (a prompt running on two servers at once;
"excused" when after a kill -9 or a stopped worker's lapsed claim), healthy-slot idle time
while prompts were waiting for one (slot-seconds), time to finish from the publish against the
best possible (each prompt's generation time over every healthy slot; tests/work_analysis.py),
and the scenario's own measures. A table, then one JSON object per scenario (`--json`: to a
file too).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from compose.emulator.request_log import prompt_digest
from compose.stack import LocalStack
from compose.tiny_tokenizers import build_qwen36_tokenizer
from streams.core.settings import KafkaSettings
from tests.benchmarks.join_storm import SLOTS, JoinStorm, StormPlan, StormResult
from tests.benchmarks.work_scenarios import (
    Fleet,
    FleetPlan,
    kill_server,
    long_tail,
    pause_server,
    zombie_worker,
)
from tests.work_analysis import Overlap, Request, work_figures

SCENARIOS = ("kill", "pause", "tail", "zombie", "storm")
COLUMNS = (
    "scenario",
    "prompts",
    "lost",
    "duplicates",
    "requested_more_than_once",
    "redone",
    "overlaps",
    "excused_overlaps",
    "idle_slot_s",
    "finish_s",
    "best_s",
)


def _say(line: str) -> None:
    print(f"  {line}", flush=True)


def plans(prompts: int | None) -> dict[str, FleetPlan]:
    base = FleetPlan(prompts=prompts or 600, partitions=16)
    return {
        "kill": base,
        "pause": base,
        "tail": replace(
            base,
            prompts=prompts or 400,
            tokens_per_s=45.0,
            min_output_tokens=64,
            max_output_tokens=256,
            long_fraction=0.15,
            long_output_tokens="3000-6000",
        ),
        "zombie": replace(base, long_fraction=0.15, long_output_tokens="1000-2000"),
    }


def storm_figures(storm: JoinStorm, result: StormResult) -> dict[str, Any]:
    """The join storm's run in the figures of the other scenarios."""
    audit = result.audit
    # each batch's prompts were published at its event (the first at the storm's start)
    batches = {"prompts.jsonl": result.started}
    late = [at for at, what, _ in result.events if "more prompts published" in what]
    for number, at in enumerate(late, start=1):
        batches[f"late-{number}.jsonl"] = result.started + at
    published: dict[str, float] = {}
    for name, at in batches.items():
        for raw in (storm.workdir / name).read_bytes().splitlines():
            prompt = audit.digests.get(prompt_digest(orjson.loads(raw)["messages"]))
            if prompt is not None:
                published[prompt] = at
    requests = [
        Request(prompt, r.slot, r.start, r.end, r.outcome)
        for prompt, asked in audit.requests.items()
        for r in asked
    ]
    killed = [(i.slot, i.ended) for i in result.incarnations if i.how == "kill -9" and i.ended]

    def after_kill(overlap: Overlap) -> bool:
        # the first request's worker was killed -9 while it ran: nobody could renew its claim
        return any(
            slot == overlap.first.server and overlap.first.start <= ended <= overlap.second.start
            for slot, ended in killed
        )

    figures = work_figures(requests, published, SLOTS, storm.plan.concurrency, [], after_kill)
    return {
        "scenario": "storm",
        "prompts": len(audit.where),
        "lost": result.lost,
        "duplicates": audit.duplicates,
        "requested_more_than_once": figures.requested_more_than_once,
        "redone": figures.redone,
        "overlaps": figures.overlaps,
        "excused_overlaps": figures.excused_overlaps,
        "idle_slot_s": round(figures.idle_slot_s, 1),
        "finish_s": round(figures.finish_s, 1),
        "best_s": round(figures.best_s, 1),
        "wall_s": round(result.wall_s, 1),
        "lag": result.lag,
    }


def run_one(
    name: str,
    args: argparse.Namespace,
    stack: LocalStack,
    bootstrap: str,
    tokenizer: Path,
    work: Path,
) -> dict[str, Any]:
    if name == "storm":
        plan = StormPlan(
            prompts=args.prompts or 1000, timeout_s=max(150.0, (args.prompts or 1000) * 0.5)
        )
        storm = JoinStorm(stack, bootstrap, tokenizer, work / name, f"{name}-", plan, say=_say)
        result = storm.run()
        print(f"  {result.line()}", flush=True)
        return storm_figures(storm, result)
    plan = plans(args.prompts)[name]
    kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=f"{name}-", partitions=plan.partitions)
    fleet = Fleet(stack, kafka, tokenizer, work / name, plan, say=_say)
    try:
        if name == "kill":
            scenario = kill_server(
                fleet, finish_timeout_s=args.kill_deadline_s, sigterm_timeout_s=args.sigterm_s
            )
        elif name == "pause":
            scenario = pause_server(fleet, pause_s=args.pause_s, finish_timeout_s=300)
        elif name == "tail":
            scenario = long_tail(fleet, finish_timeout_s=600)
        else:
            scenario = zombie_worker(fleet, pause_s=args.zombie_pause_s, finish_timeout_s=300)
    finally:
        fleet.stop()
    print(scenario.report(), flush=True)
    found = scenario.as_json()
    if isinstance(found.get("left_not_on_stopped_server"), list):
        found["left_not_on_stopped_server"] = len(found["left_not_on_stopped_server"])
    return found


def table(rows: list[dict[str, Any]]) -> str:
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in COLUMNS]
    lines = ["  ".join(c.rjust(w) for c, w in zip(COLUMNS, widths, strict=True))]
    for row in rows:
        lines.append(
            "  ".join(str(row.get(c, "")).rjust(w) for c, w in zip(COLUMNS, widths, strict=True))
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=(*SCENARIOS, "all"), default="all")
    parser.add_argument("--prompts", type=int, default=None, help="default: per scenario")
    parser.add_argument("--kill-deadline-s", type=float, default=180.0)
    parser.add_argument("--sigterm-s", type=float, default=60.0)
    parser.add_argument("--pause-s", type=float, default=90.0)
    parser.add_argument("--zombie-pause-s", type=float, default=45.0)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    parser.add_argument("--keep", action="store_true", help="keep the logs' directory")
    args = parser.parse_args(argv)
    chosen = SCENARIOS if args.scenario == "all" else (args.scenario,)
    work = Path(tempfile.mkdtemp(prefix="draftgen-work-"))
    print(f"work distribution: {', '.join(chosen)}; logs in {work}", flush=True)
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        with LocalStack(work / "stack") as stack:
            bootstrap = stack.start_kafka()
            tokenizer = build_qwen36_tokenizer(work / "tokenizer")
            for name in chosen:
                print(f"{name}:", flush=True)
                began = time.monotonic()
                row = run_one(name, args, stack, bootstrap, tokenizer, work)
                row["scenario_wall_s"] = round(time.monotonic() - began, 1)
                rows.append(row)
    except KeyboardInterrupt:
        print("interrupted: every process started was stopped", file=sys.stderr)
        return 130
    finally:
        if rows:
            print(table(rows), flush=True)
            for row in rows:
                print(json.dumps(row), flush=True)
            if args.json is not None:
                args.json.write_text(json.dumps(rows, indent=2) + "\n")
        print(f"benchmark wall {time.monotonic() - started:.0f}s", flush=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
