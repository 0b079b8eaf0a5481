"""`draftgen report`: what a dataset version holds, computed from its shards and what the run
recorded, so people can look at their data before they spend GPU-days on it.

Shards keep `input_ids` and `loss_mask`, not the turn's parts, so lengths are derived:

- prompt: the tokens before the first supervised one (for a truncated sample, what is left);
- generated: the supervised tokens (the assistant turn the target produced);
- reasoning / answer: the supervised tokens up to and including the first supervised
  `</think>` token of the dataset's tokenizer, and those after it. Samples without one
  (thinking off, unclosed thinking kept, truncated inside it) are counted, not split. Without
  a loadable tokenizer the split is not computed and the report says why;
- total: all tokens.

Drift and truncation come from the commit markers; policy drops and errors from the sealed
manifest (per version) or else from the `dead-letters` topic (shared by every version under the
topic prefix); duplicates removed by the tokenize stage from its workers' heartbeats, which last
only while a worker runs or after it crashed. What is not available is reported as
"not recorded", never as zero.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sinks.manifest import SealedManifest
from sinks.reader import DatasetReader
from streams.core.families import detect_family
from streams.core.records import is_policy_drop
from streams.core.settings import KafkaSettings
from streams.ops.heartbeat import HeartbeatReader
from streams.ops.progress import DeadLetterReader

NOT_RECORDED = "not recorded"
LENGTHS = ("prompt", "reasoning", "answer", "total")
# the drift causes the report lists, most frequent first
REPORT_CAUSES = 20


# -- lengths ---------------------------------------------------------------------------------


def _first_per_row(positions: np.ndarray, offsets: np.ndarray, rows: int) -> np.ndarray:
    """Index of the first of `positions` (sorted flat indices) in each row; -1 where none."""
    first = np.full(rows, -1, dtype=np.int64)
    if len(positions):
        row_of = np.searchsorted(offsets, positions, side="right") - 1
        unique_rows, index = np.unique(row_of, return_index=True)
        first[unique_rows] = positions[index]
    return first


def sample_lengths(table: pa.Table, think_close: int | None) -> dict[str, np.ndarray]:
    """Per sample: prompt, generated, total, reasoning and answer lengths (the last two -1
    where the sample has no supervised `think_close` or no token id is known)."""
    rows = table.num_rows
    ids_column = table.column("input_ids").combine_chunks()
    mask_column = table.column("loss_mask").combine_chunks()
    raw_offsets = mask_column.offsets.to_numpy().astype(np.int64)
    offsets = raw_offsets - raw_offsets[0]
    mask = mask_column.flatten().to_numpy()
    ids = ids_column.flatten().to_numpy()
    lengths = np.diff(offsets)
    prefix = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
    generated = prefix[offsets[1:]] - prefix[offsets[:-1]]
    first_loss = _first_per_row(np.flatnonzero(mask), offsets, rows)
    prompt = np.where(first_loss >= 0, first_loss - offsets[:-1], lengths)
    reasoning = np.full(rows, -1, dtype=np.int64)
    if think_close is not None:
        close = _first_per_row(np.flatnonzero((ids == think_close) & (mask == 1)), offsets, rows)
        split = close >= 0
        reasoning[split] = prefix[close[split] + 1] - prefix[offsets[:-1][split]]
    answer = np.where(reasoning >= 0, generated - reasoning, -1)
    return {
        "prompt": prompt,
        "generated": generated,
        "total": lengths,
        "reasoning": reasoning,
        "answer": answer,
    }


def distribution(values: np.ndarray, bins: int) -> dict[str, Any]:
    """Summary figures and a histogram (bin edges and counts) of non-negative lengths."""
    if len(values) == 0:
        return {"count": 0}
    top = int(values.max())
    counts, edges = np.histogram(values, bins=bins, range=(0, max(top, 1)))
    return {
        "count": len(values),
        "min": int(values.min()),
        "max": top,
        "mean": round(float(values.mean()), 2),
        "p50": float(np.percentile(values, 50)),
        "p90": float(np.percentile(values, 90)),
        "p99": float(np.percentile(values, 99)),
        "histogram": {"edges": [round(float(e), 2) for e in edges], "counts": counts.tolist()},
    }


@dataclass
class LengthCounts:
    """How many samples have each length, per figure: the lengths' distribution in memory
    that grows with the longest sample, not with the number of samples. Negative lengths
    (reasoning and answer of a sample that was not split) are counted apart."""

    counts: dict[str, np.ndarray] = field(default_factory=dict)
    unsplit: int = 0

    def add(self, lengths: dict[str, np.ndarray]) -> None:
        for name, values in lengths.items():
            known = values[values >= 0]
            if name == "reasoning":
                self.unsplit += len(values) - len(known)
            counts = np.bincount(known, minlength=len(self.counts.get(name, ())))
            if name in self.counts:
                counts[: len(self.counts[name])] += self.counts[name]
            self.counts[name] = counts

    def distribution(self, name: str, bins: int) -> dict[str, Any]:
        return distribution_of_counts(self.counts.get(name, np.zeros(0, np.int64)), bins)


def distribution_of_counts(counts: np.ndarray, bins: int) -> dict[str, Any]:
    """`distribution` of the lengths whose counts are `counts` (counts[n]: samples of length
    n), figure for figure (numpy's linear percentiles)."""
    total = int(counts.sum())
    if total == 0:
        return {"count": 0}
    present = np.flatnonzero(counts)
    low, top = int(present[0]), int(present[-1])
    lengths = np.arange(len(counts))
    histogram, edges = np.histogram(lengths, bins=bins, range=(0, max(top, 1)), weights=counts)
    cumulative = np.cumsum(counts)

    def nth(k: int) -> int:  # the k-th smallest length, from 0
        return int(np.searchsorted(cumulative, k, side="right"))

    def percentile(q: float) -> float:  # numpy's "linear" method, to the last bit
        at = (total - 1) * (q / 100)
        below = int(np.floor(at))
        lower, upper = nth(below), nth(min(below + 1, total - 1))
        gamma, diff = at - below, float(upper - lower)
        return float(upper - diff * (1 - gamma) if gamma >= 0.5 else lower + diff * gamma)

    return {
        "count": total,
        "min": low,
        "max": top,
        "mean": round(float((lengths * counts).sum() / total), 2),
        "p50": percentile(50),
        "p90": percentile(90),
        "p99": percentile(99),
        "histogram": {
            "edges": [round(float(e), 2) for e in edges],
            "counts": histogram.astype(np.int64).tolist(),
        },
    }


def think_close_id(tokenizer_dir: str | None) -> tuple[int | None, str]:
    """The token id that closes thinking in this tokenizer, or None and why not."""
    if not tokenizer_dir:
        return None, "no tokenizer directory recorded in dataset.json (give --tokenizer)"
    path = Path(tokenizer_dir)
    if not path.is_dir():
        return None, f"tokenizer directory {path} is not on this machine (give --tokenizer)"
    try:
        from transformers import AutoTokenizer

        logging.getLogger("transformers").setLevel(logging.ERROR)
        token = detect_family(path).think_close
        tokenizer = AutoTokenizer.from_pretrained(
            str(path), trust_remote_code=True, local_files_only=True
        )
        token_id = tokenizer.convert_tokens_to_ids(token)
    except Exception as err:
        return None, f"cannot load the tokenizer in {path}: {str(err).splitlines()[0][:200]}"
    if not isinstance(token_id, int) or tokenizer.convert_ids_to_tokens(token_id) != token:
        return None, f"{token} is not a single token of the tokenizer in {path}"
    return token_id, f"{token} = id {token_id} ({path})"


# -- what the run recorded -------------------------------------------------------------------


@dataclass
class KafkaFacts:
    """From the broker: dead letters (every version under the prefix) and the dataset's
    tokenize workers' heartbeats."""

    dead_letters: Counter[tuple[str, str]] = field(default_factory=Counter)
    policy_prompt_ids: int = 0
    tokenize_workers: int = 0
    duplicates: int = 0


async def read_kafka_facts(kafka: KafkaSettings, dataset: str) -> KafkaFacts:
    dead = DeadLetterReader(kafka)
    beats = HeartbeatReader(kafka)
    try:
        tally = await dead.poll()
        latest = await beats.poll()
    finally:
        await dead.close()
        await beats.close()
    mine = [b for b in latest.values() if b.role == "tokenize" and b.label == dataset]
    return KafkaFacts(
        dead_letters=Counter(tally.by_reason),
        policy_prompt_ids=len(tally.policy_ids),
        tokenize_workers=len(mine),
        duplicates=sum(int(b.counters.get("duplicates", 0)) for b in mine),
    )


# -- the report ------------------------------------------------------------------------------


@dataclass
class _Totals:
    samples: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    by_source: dict[str, Counter[str]] = field(default_factory=dict)
    finish_reasons: Counter[str] = field(default_factory=Counter)
    token_sources: Counter[str] = field(default_factory=Counter)
    # the prompt ids, hashed: enough to count duplicates, 8 bytes a sample
    id_hashes: list[np.ndarray] = field(default_factory=list)
    lengths: LengthCounts = field(default_factory=LengthCounts)

    def add(self, table: pa.Table, think_close: int | None) -> None:
        self.samples += table.num_rows
        self.tokens += int(pc.sum(table["num_tokens"]).as_py() or 0)
        self.loss_tokens += int(pc.sum(table["num_loss_tokens"]).as_py() or 0)
        grouped = table.group_by("source").aggregate(
            [("num_tokens", "sum"), ("num_loss_tokens", "sum"), ("source", "count")]
        )
        for row in grouped.to_pylist():
            counts = self.by_source.setdefault(str(row["source"]), Counter())
            counts["samples"] += row["source_count"]
            counts["tokens"] += row["num_tokens_sum"]
            counts["loss_tokens"] += row["num_loss_tokens_sum"]
        self.finish_reasons.update(_counts(table["finish_reason"]))
        self.token_sources.update(_counts(table["token_source"]))
        ids = table["prompt_id"].to_pylist()
        self.id_hashes.append(np.fromiter(map(hash, ids), dtype=np.int64, count=len(ids)))
        self.lengths.add(sample_lengths(table, think_close))

    def distinct_ids(self) -> int:
        hashes = np.concatenate(self.id_hashes) if self.id_hashes else np.zeros(0, np.int64)
        return len(np.unique(hashes))


def _counts(column: pa.ChunkedArray) -> dict[str, int]:
    return {str(v["values"]): int(v["counts"]) for v in pc.value_counts(column).to_pylist()}


def build_report(
    reader: DatasetReader,
    *,
    think_close: int | None,
    split_note: str,
    kafka: KafkaFacts | None = None,
    bins: int = 40,
) -> dict[str, Any]:
    """Every figure of the report as JSON-able values."""
    manifest = reader.sealed()
    refs = reader.shards()
    totals = _Totals()
    for ref in refs:
        totals.add(reader.read_shard(ref), think_close)
    markers = reader.markers(refs)
    lengths = totals.lengths
    split = int(lengths.counts["reasoning"].sum()) if "reasoning" in lengths.counts else 0
    not_recorded: list[str] = []

    report: dict[str, Any] = {
        "dataset": reader.name,
        "url": reader.store.url,
        "created_at": time.time(),
        "sealed": manifest is not None,
        "shards": len(refs),
        "samples": totals.samples,
        "tokens": totals.tokens,
        "loss_tokens": totals.loss_tokens,
        "loss_fraction": round(totals.loss_tokens / totals.tokens, 4) if totals.tokens else None,
        "by_source": {s: dict(c) for s, c in sorted(totals.by_source.items())},
        "finish_reasons": dict(totals.finish_reasons.most_common()),
        "token_sources": dict(totals.token_sources.most_common()),
    }
    report["lengths"] = {
        "prompt": lengths.distribution("prompt", bins),
        "reasoning": lengths.distribution("reasoning", bins)
        if think_close is not None and "reasoning" in lengths.counts
        else None,
        "answer": lengths.distribution("answer", bins)
        if think_close is not None and "answer" in lengths.counts
        else None,
        "total": lengths.distribution("total", bins),
        "generated": lengths.distribution("generated", bins),
    }
    report["reasoning_split"] = {
        "computed": think_close is not None,
        "think_close_id": think_close,
        "note": split_note,
        "samples_split": split if think_close is not None else 0,
        "samples_without_think_close": lengths.unsplit if think_close is not None else None,
    }
    if think_close is None:
        not_recorded += ["lengths.reasoning", "lengths.answer"]

    compared = sum(m.compared for m in markers)
    drifted = sum(m.drifted for m in markers)
    causes: Counter[str] = Counter()
    for marker in markers:
        causes.update(marker.drift_causes)
    report["drift"] = {
        "compared": compared,
        "drifted": drifted,
        "rate": round(drifted / compared, 4) if compared else NOT_RECORDED,
        # the most frequent first; each marker keeps only its window's most frequent
        "causes": dict(causes.most_common(REPORT_CAUSES)),
    }
    if not compared:
        not_recorded.append("drift.rate")
    report["truncated"] = sum(m.truncated for m in markers)

    report["policy_drops"], report["errors"] = _drops(manifest, kafka)
    for name in ("policy_drops", "errors"):
        if report[name]["by_kind"] == NOT_RECORDED:
            not_recorded.append(name)

    report["duplicates"] = {
        # should be 0: the sink writes each prompt id once per version
        "duplicate_ids_in_version": totals.samples - totals.distinct_ids(),
        "excluded_by_seal": sum(len(r.exclude) for r in refs) if manifest else NOT_RECORDED,
        "removed_by_tokenize": kafka.duplicates
        if kafka is not None and kafka.tokenize_workers
        else NOT_RECORDED,
        "note": "removed_by_tokenize sums the dataset's tokenize workers' heartbeats (only "
        "while a worker runs, or its last one after a crash; needs --bootstrap); "
        "excluded_by_seal counts earlier answers the sealed manifest leaves out",
    }
    for name in ("excluded_by_seal", "removed_by_tokenize"):
        if report["duplicates"][name] == NOT_RECORDED:
            not_recorded.append(f"duplicates.{name}")
    report["not_recorded"] = not_recorded
    return report


def _drops(
    manifest: SealedManifest | None, kafka: KafkaFacts | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(policy drops, errors), each {"source", "by_kind"}: from the sealed manifest (exactly this
    version) or the dead-letters topic (every version under the prefix; a prompt redelivered or
    dropped by two versions counts twice); else not recorded."""
    policy: dict[str, int] = {}
    errors: dict[str, int] = {}
    if manifest is not None:
        for kind, count in sorted(manifest.drops.items()):
            (policy if is_policy_drop(kind) else errors)[kind] = count
        source = "sealed manifest (prompt ids of this version)"
        return {"source": source, "by_kind": policy}, {"source": source, "by_kind": errors}
    if kafka is not None:
        for (stage, kind), count in sorted(kafka.dead_letters.items()):
            if is_policy_drop(kind):  # the tokenize stage's sample policy
                policy[kind] = policy.get(kind, 0) + count
            else:
                errors[f"{stage}/{kind}"] = count
        source = "dead-letters topic (letters, all dataset versions under this topic prefix)"
        return (
            {"source": source, "by_kind": policy, "prompt_ids": kafka.policy_prompt_ids},
            {"source": source, "by_kind": errors},
        )
    missing = {"source": "needs --bootstrap or a sealed version", "by_kind": NOT_RECORDED}
    return dict(missing), dict(missing)


__all__ = [
    "LENGTHS",
    "NOT_RECORDED",
    "KafkaFacts",
    "build_report",
    "distribution",
    "distribution_of_counts",
    "read_kafka_facts",
    "sample_lengths",
    "think_close_id",
]
