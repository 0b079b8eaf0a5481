"""What `run` prints when it ends: the summary of the version built, the audit, and the next
steps as commands that work as printed."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from streams.cli.run_wait import TOKENIZE_STAGE, RunResult
from streams.core.records import POLICY_PREFIX, is_policy_drop
from streams.core.settings import KafkaSettings
from streams.tools.audit import AuditResult, republish_command


def draftgen_command() -> list[str]:
    """How to call this draftgen again: the venv's script beside this interpreter, else the
    interpreter with `-m streams` (either works from any directory)."""
    script = Path(sys.executable).parent / "draftgen"
    return [str(script)] if script.exists() else [sys.executable, "-m", "streams"]


def print_next_steps(
    *,
    out: str,
    dataset: str,
    tokenizer: str,
    broker: str | None,
    broker_kept: bool,
    topic_prefix: str = "",
) -> None:
    """What to do next, as commands that work as printed (from any directory)."""
    import shlex

    def command(*words: str, needs_broker: bool = False) -> str:
        extra: list[str] = []
        if needs_broker and broker:
            extra += ["--bootstrap", broker]
        if needs_broker and topic_prefix:
            extra += ["--topic-prefix", topic_prefix]
        return shlex.join([*draftgen_command(), *words, *extra])

    where = ["--out", out, "--dataset", dataset]
    print("next:")
    print(f"  look at the data:  {command('report', *where, needs_broker=broker_kept)}")
    export = [*where, "--format", "specforge", "--to", f"{dataset}.jsonl"]
    print(f"  export it:         {command('export', *export)}")
    if not broker_kept:
        up = shlex.join([*draftgen_command(), "stack", "up"])
        print(
            "  the broker stopped with this run: to keep it for status, dead-letters, replay "
            f"and seal, start a local stack first ({up}) and run again"
        )
        return
    print(f"  where it stands:   {command('status', '--out', out, needs_broker=True)}")
    print(f"  failed prompts:    {command('dead-letters', needs_broker=True)}")
    replay = ["--out", out, "--dataset", f"{dataset}-v2", "--tokenizer-dir", tokenizer]
    print(
        f"  rebuild (replay):  {command('replay', *replay, needs_broker=True)}"
        "   (add --chat-template-file FILE; it ends once caught up, --follow keeps following)"
    )
    print(f"  seal the version:  {command('seal', *where, needs_broker=True)}")
    if broker is None:
        print(f"  when done:         {shlex.join([*draftgen_command(), 'stack', 'down'])}")


# the drift causes the summary names: the top few say what to fix first
SUMMARY_CAUSES = 5


def print_summary(result: RunResult, dataset_url: str, workdir: Path, before: int = 0) -> None:
    """`before`: how many of the prompts were generated before (their stored completions built)."""
    figures, tally = result.figures, result.dead_letters
    print(f"done in {result.elapsed_s:.1f}s: {result.expected} prompts")
    print(
        f"  prompts      {result.expected - before} generated now, {before} from before "
        "(built from their stored completions)"
    )
    print(f"  samples      {figures.samples}")
    print(f"  tokens       {figures.tokens}")
    print(f"  loss tokens  {figures.loss_tokens}")
    print(f"  shards       {figures.shards} in {dataset_url}")
    if figures.compared:
        share = figures.drifted / figures.compared
        print(
            f"  drift        {figures.drifted} of {figures.compared} compared samples "
            f"({share:.1%}) differ from the template's rendering"
        )
        for cause, count in figures.drift_causes.most_common(SUMMARY_CAUSES):
            print(f"    {cause}: {count}")
    else:
        print("  drift        not measured (no sample with server ids was compared)")
    if figures.truncated:
        print(f"  truncated    {figures.truncated} samples cut to --max-seq-len")
    if figures.replaced:
        print(f"  replaced     {figures.replaced} earlier answers (latest answer wins)")
    # this version's drops are its markers' (once each); earlier stages' are dead letters
    drops = Counter(figures.drops.values())
    policy = sorted((k, n) for k, n in drops.items() if is_policy_drop(k))
    dropped = sum(n for _, n in policy)
    print(f"  policy drops {dropped} (by the sample policy, not failures)")
    for kind, count in policy:
        print(f"    {kind.removeprefix(POLICY_PREFIX)}: {count}")
    # this run's prompts' letters only; a kept stack's other runs' are one line at most
    mine = tally.reasons_of(result.prompt_ids)
    upstream = {k: n for k, n in mine.items() if k[0] != TOKENIZE_STAGE}
    errors = {(TOKENIZE_STAGE, k): n for k, n in drops.items() if not is_policy_drop(k)}
    failed = len(tally.ids_before(TOKENIZE_STAGE) & result.prompt_ids) + sum(errors.values())
    print(f"  dead letters {failed}")
    for (stage, kind), count in sorted({**upstream, **errors}.items()):
        print(f"    {stage}/{kind}: {count}")
    if others := len(tally.prompt_ids - result.prompt_ids):
        print(f"  (and {others} prompts of other runs on this stack: draftgen dead-letters)")
    print(f"  logs         {workdir / 'logs'}")


def print_audit(audited: AuditResult, kafka: KafkaSettings) -> None:
    """The audit of the run's prompts, its first line beside the summary's."""
    first, *rest = audited.lines(republish_command(draftgen_command(), kafka))
    print(f"  audit        {first}")
    for line in rest:
        print(f"    {line}")
