"""The join storm (issue 31): generate workers joining, leaving by SIGTERM and killed -9 while
prompts are in flight, audited from the topics: every published prompt has an outcome, one kind
of it, and the group's committed offsets reach the topic's ends. The scenario and the audit are
in tests/benchmarks/join_storm.py (its benchmark, bench_join_storm.py, repeats it at 1,000)."""

from __future__ import annotations

from pathlib import Path

import pytest

from compose.stack import LocalStack
from tests.benchmarks.join_storm import JoinStorm, StormPlan

pytestmark = pytest.mark.integration


def test_workers_joining_leaving_and_killed_lose_no_prompt(
    stack: LocalStack,
    bootstrap: str,
    qwen_tokenizer_dir: Path,
    topic_prefix: str,
    tmp_path: Path,
) -> None:
    storm = JoinStorm(
        stack,
        bootstrap,
        qwen_tokenizer_dir,
        tmp_path / "storm",
        topic_prefix,
        # claims lapse in 5 s, not 15 (renewed every 1.7 s): the new owners of c's claimed
        # prompts (killed -9) ask their own servers 10 s sooner
        StormPlan(claim_s=5.0),
        say=print,
    )
    result = storm.run()
    report = result.report()
    print(report)
    audit = result.audit

    # every membership change came while prompts were in flight, or the test proves nothing
    changes = [(what, lag) for _, what, lag in result.events[1:-1]]
    assert all(lag > 0 for _, lag in changes), f"a change after the prompts were done\n{report}"
    # the request logs name the prompts the workers sent (else their counts mean nothing)
    assert not audit.completed_unrequested, f"completions no server logged\n{report}"
    assert all(inc.how == "running" for inc in storm.workers.values()), report

    assert not audit.missing, f"{result.lost} prompts without an outcome\n{report}"
    assert result.lag == 0, f"the generate group did not commit to the topic's end\n{report}"
    # Not asserted: a prompt whose partition moved can end with both a completion (its old
    # owner's request, finished after the revocation) and a dead letter (its new owner's, which
    # failed before that completion reached the ledger). Its sample is in the dataset; the
    # failure table says so ("worker joins or leaves"). Seen twice in ~16,000 storm prompts;
    # the report above counts them.
    assert not audit.ledger_without_outcome, f"ledger marks without their outcome\n{report}"
