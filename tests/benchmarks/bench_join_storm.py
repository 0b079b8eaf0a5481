"""The join storm (tests/benchmarks/join_storm.py) repeated: N runs (default 5) of 1,000 prompts
each, generate workers joining, leaving by SIGTERM and killed -9 while prompts are in flight,
each run audited from the topics (issue 31; issue 32 wants the redone generations).

    flock /tmp/draftgen-heavy.lock .venv/bin/python tests/benchmarks/bench_join_storm.py \\
        [--runs 5] [--prompts 1000] [--keep]

Starts its own Kafka broker (no S3: only the generate stage runs); each run has its own topics,
emulated servers and workers, all stopped when the run ends. Everything it started is stopped
however it ends, Ctrl-C included (the `LocalStack` of `draftgen run`). Prints, per run and in
total: prompts, lost (no outcome), duplicates (outcomes beyond one a prompt), prompts requested
more than once, successful generations redone (whole answers beyond a prompt's first) and
thrown away (whole answers beyond the completions kept), wall time from the publish; a lost
prompt is listed with its partition@offset and who requested it. Exit status 1 if any was lost.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from compose.stack import LocalStack
from compose.tiny_tokenizers import build_qwen36_tokenizer
from tests.benchmarks.join_storm import JoinStorm, StormPlan, StormResult


def _say(line: str) -> None:
    print(f"  {line}", flush=True)


def total_line(results: list[StormResult]) -> str:
    audits = [r.audit for r in results]
    return (
        f"total: runs {len(results)}, prompts {sum(len(a.where) for a in audits)}, "
        f"lost {sum(r.lost for r in results)}, "
        f"duplicates {sum(a.duplicates for a in audits)}, "
        f"requested more than once {sum(a.requested_more_than_once for a in audits)}, "
        f"successful generations {sum(a.successful for a in audits)}, "
        f"redone {sum(a.redone for a in audits)}, "
        f"thrown away {sum(a.thrown_away for a in audits)}, "
        f"wall {sum(r.wall_s for r in results):.1f}s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=1000)
    parser.add_argument("--keep", action="store_true", help="keep the logs' directory")
    args = parser.parse_args(argv)
    plan = replace(StormPlan(), prompts=args.prompts, timeout_s=max(150.0, args.prompts * 0.5))
    work = Path(tempfile.mkdtemp(prefix="draftgen-storm-"))
    print(
        f"join storm: {args.runs} runs of {args.prompts} prompts (+2 × {plan.late_prompts} late); "
        f"logs in {work}",
        flush=True,
    )
    results: list[StormResult] = []
    started = time.monotonic()
    try:
        with LocalStack(work / "stack") as stack:
            bootstrap = stack.start_kafka()
            tokenizer = build_qwen36_tokenizer(work / "tokenizer")
            for run in range(1, args.runs + 1):
                print(f"run {run}:", flush=True)
                storm = JoinStorm(
                    stack, bootstrap, tokenizer, work / f"run{run}", f"storm{run}-", plan, say=_say
                )
                result = storm.run()
                results.append(result)
                print(f"run {run}: {result.line()}", flush=True)
                if result.lost or result.audit.both_kinds:
                    print(result.report(), flush=True)
    except KeyboardInterrupt:
        print("interrupted: every process started was stopped", file=sys.stderr)
        return 130
    finally:
        if results:
            print(total_line(results), flush=True)
        print(f"benchmark wall {time.monotonic() - started:.0f}s", flush=True)
        if not args.keep and not any(r.lost for r in results):
            shutil.rmtree(work, ignore_errors=True)
    return 1 if any(r.lost for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
