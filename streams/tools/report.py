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

Every count is the version's own, as `status`, the sealed manifest, the reader and
`dead-letters` give it:

- samples, tokens, shards: the version's shards (the sealed manifest's, else the committed
  windows), as the reader reads them;
- policy drops and the tokenize stage's errors: the version's recorded drops (the sealed
  manifest's `dropped`, else the commit markers'), each prompt once. The `dead-letters` topic is
  not used for them: it holds the letters of every version under the topic prefix;
- errors of the stages before (publish rejects, generate failures): the `dead-letters` topic,
  letters of stages other than `tokenize` (with `--bootstrap`, or the local stack's broker).
  Every version built from the same `completions` shares them;
- per source: lengths from the shards; drop rates need the source of each dropped prompt,
  which only its dead letter's payload holds (so they need the broker too);
- the supervised-token frequency table (token id → count over loss_mask == 1): what an EAGLE-3
  draft vocabulary is chosen from (SpecForge's `process_token_dict_to_mappings`).

Drift and truncation come from the commit markers; duplicates removed by the tokenize stage
from its workers' heartbeats, which last only while a worker runs or after it crashed. What is
not available is reported as "not recorded", never as zero.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from sinks.marker import ShardMarker
from sinks.reader import DatasetReader
from streams.core.records import DeadLetter, RecordError, is_policy_drop
from streams.core.settings import KafkaSettings
from streams.observe.heartbeat import HeartbeatReader
from streams.tools.progress import DeadLetterReader
from streams.tools.report_gate import version_gate
from streams.tools.report_lengths import (
    LENGTHS,
    LengthCounts,
    distribution,
    distribution_of_counts,
    load_report_tokenizer,
    sample_lengths,
    think_close_id,
)
from streams.tools.report_provenance import ProvenanceTotals
from streams.tools.worker_figures import DUPLICATES

NOT_RECORDED = "not recorded"
# the drift causes the report lists, most frequent first
REPORT_CAUSES = 20
# the most frequent supervised tokens report.json lists (the whole table is token_freq.json)
REPORT_TOP_TOKENS = 50
TOKENIZE_STAGE = "tokenize"
UNKNOWN_SOURCE = "(unknown)"


# -- what the run recorded -------------------------------------------------------------------


@dataclass
class KafkaFacts:
    """From the broker: dead letters (of every version under the prefix: the report keeps the
    stages before tokenize, and the sources of the prompts the tokenize stage dropped) and the
    dataset's tokenize workers' heartbeats."""

    dead_letters: Counter[tuple[str, str]] = field(default_factory=Counter)
    # letters of the stages before tokenize, by the source of their prompt or row
    upstream_by_source: Counter[str] = field(default_factory=Counter)
    # prompt id → source, of the tokenize stage's letters (a version's drops are among them)
    tokenize_sources: dict[str, str] = field(default_factory=dict)
    tokenize_workers: int = 0
    duplicates: int = 0

    def note(self, letter: DeadLetter) -> None:
        """Keep what the report needs of one letter: its source, not its payload."""
        if letter.stage == TOKENIZE_STAGE:
            if letter.prompt_id:
                self.tokenize_sources[letter.prompt_id] = letter_source(letter)
        else:
            self.upstream_by_source[letter_source(letter)] += 1


def letter_source(letter: DeadLetter) -> str:
    """The source of a letter's prompt (a prompt or completion record's `source`), or for a
    row `publish` rejected, its origin's file (`path:row`)."""
    try:
        record = orjson.loads(letter.payload_bytes())
    except (orjson.JSONDecodeError, RecordError):
        record = None
    if isinstance(record, dict) and isinstance(record.get("source"), str):
        return str(record["source"])
    if letter.stage == "publish" and letter.origin and ":" in letter.origin:
        return letter.origin.rsplit(":", 1)[0]
    return UNKNOWN_SOURCE


async def read_kafka_facts(kafka: KafkaSettings, dataset: str) -> KafkaFacts:
    facts = KafkaFacts()
    dead = DeadLetterReader(kafka, on_letter=facts.note)
    beats = HeartbeatReader(kafka)
    try:
        tally = await dead.poll()
        latest = await beats.poll()
    finally:
        await dead.close()
        await beats.close()
    mine = [b for b in latest.values() if b.role == "tokenize" and b.label == dataset]
    facts.dead_letters = Counter(tally.by_reason)
    facts.tokenize_workers = len(mine)
    facts.duplicates = sum(int(b.figure(DUPLICATES)) for b in mine)
    return facts


# -- the report ------------------------------------------------------------------------------


@dataclass
class _Totals:
    samples: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    by_source: dict[str, Counter[str]] = field(default_factory=dict)
    # per source, each sample's total and generated length (8 bytes a sample)
    source_lengths: dict[str, list[np.ndarray]] = field(default_factory=dict)
    finish_reasons: Counter[str] = field(default_factory=Counter)
    token_sources: Counter[str] = field(default_factory=Counter)
    # the prompt ids, hashed: enough to count duplicates, 8 bytes a sample
    id_hashes: list[np.ndarray] = field(default_factory=list)
    lengths: LengthCounts = field(default_factory=LengthCounts)
    # supervised tokens (loss_mask == 1) by token id: grows with the vocabulary, not the data
    token_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    provenance: ProvenanceTotals = field(default_factory=ProvenanceTotals)

    def add(self, table: pa.Table, think_close: int | None) -> None:
        self.samples += table.num_rows
        self.provenance.add(table)
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
        lengths = sample_lengths(table, think_close)
        self.lengths.add(lengths)
        sources = np.array([str(s) for s in table["source"].to_pylist()], dtype=object)
        for source in set(sources):
            rows = sources == source
            pair = np.stack([lengths["total"][rows], lengths["generated"][rows]]).astype(np.int32)
            self.source_lengths.setdefault(source, []).append(pair)
        self._count_tokens(table)

    def _count_tokens(self, table: pa.Table) -> None:
        ids = table.column("input_ids").combine_chunks().flatten().to_numpy()
        mask = table.column("loss_mask").combine_chunks().flatten().to_numpy()
        counts = np.bincount(ids[mask == 1].astype(np.int64), minlength=len(self.token_counts))
        counts[: len(self.token_counts)] += self.token_counts
        self.token_counts = counts

    def distinct_ids(self) -> int:
        hashes = np.concatenate(self.id_hashes) if self.id_hashes else np.zeros(0, np.int64)
        return len(np.unique(hashes))

    def source_figures(self, source: str) -> dict[str, Any]:
        pairs = np.concatenate(self.source_lengths[source], axis=1)
        figures: dict[str, Any] = dict(self.by_source[source])
        for name, values in (("length", pairs[0]), ("generated", pairs[1])):
            figures[f"mean_{name}"] = round(float(values.mean()), 2)
            figures[f"p50_{name}"] = float(np.percentile(values, 50))
            figures[f"p90_{name}"] = float(np.percentile(values, 90))
            figures[f"max_{name}"] = int(values.max())
        return figures


def _counts(column: pa.ChunkedArray) -> dict[str, int]:
    return {str(v["values"]): int(v["counts"]) for v in pc.value_counts(column).to_pylist()}


def collect(reader: DatasetReader, think_close: int | None) -> _Totals:
    """Read every shard of the version once (bounded memory: a shard at a time)."""
    totals = _Totals()
    for ref in reader.shards():
        totals.add(reader.read_shard(ref), think_close)
    return totals


def version_drops(reader: DatasetReader) -> tuple[dict[str, str], str]:
    """The version's recorded drops (prompt id → kind), each prompt once, and where from: the
    sealed manifest, else the commit markers resolved as `status` resolves them."""
    manifest = reader.sealed()
    if manifest is not None:
        return dict(manifest.dropped), "sealed manifest (this version)"
    drops = reader.store.committed(keep_ids=False).drops
    return dict(drops), "commit markers (this version)"


def top_tokens(counts: np.ndarray, tokenizer: Any = None, top: int = REPORT_TOP_TOKENS) -> list:
    """The `top` most frequent supervised tokens, most frequent first (ties: lower id first)."""
    present = np.flatnonzero(counts)
    order = present[np.lexsort((present, -counts[present]))][:top]
    rows: list[dict[str, Any]] = []
    for token_id in order.tolist():
        row: dict[str, Any] = {"id": token_id, "count": int(counts[token_id])}
        if tokenizer is not None:
            row["token"] = str(tokenizer.convert_ids_to_tokens(token_id))
        rows.append(row)
    return rows


def token_frequencies(counts: np.ndarray) -> dict[str, int]:
    """token id → supervised count, every token seen, most frequent first: the `token_dict`
    SpecForge counts for its EAGLE-3 vocabulary mapping (JSON keys are strings)."""
    return {str(row["id"]): row["count"] for row in top_tokens(counts, top=len(counts))}


def build_report(
    reader: DatasetReader,
    *,
    think_close: int | None,
    split_note: str,
    kafka: KafkaFacts | None = None,
    bins: int = 40,
    totals: _Totals | None = None,
    tokenizer: Any = None,
) -> dict[str, Any]:
    """Every figure of the report as JSON-able values."""
    manifest = reader.sealed()
    refs = reader.shards()
    if totals is None:
        totals = collect(reader, think_close)
    markers = reader.markers(refs)
    lengths = totals.lengths
    split = int(lengths.counts["reasoning"].sum()) if "reasoning" in lengths.counts else 0
    not_recorded: list[str] = []
    drops, drops_from = version_drops(reader)

    report: dict[str, Any] = {
        "dataset": reader.name,
        "url": reader.store.url,
        "created_at": time.time(),
        "sealed": manifest is not None,
        "shards": len({ref.path for ref in refs}),
        "samples": totals.samples,
        "tokens": totals.tokens,
        "loss_tokens": totals.loss_tokens,
        "loss_fraction": round(totals.loss_tokens / totals.tokens, 4) if totals.tokens else None,
        "by_source": _by_source(totals, drops, kafka),
        "finish_reasons": dict(totals.finish_reasons.most_common()),
        "token_sources": dict(totals.token_sources.most_common()),
        "provenance": totals.provenance.section(),
    }
    if kafka is None:
        not_recorded.append("by_source.drop_rate")
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
    report["drift"] = _drift(markers)
    if not report["drift"]["compared"]:
        not_recorded.append("drift.rate")
    report["truncated"] = sum(m.truncated for m in markers)

    report["policy_drops"], report["errors"] = _drops(drops, drops_from, kafka)
    report["quality_gate"] = version_gate(reader)
    if report["errors"]["upstream"]["by_kind"] == NOT_RECORDED:
        not_recorded.append("errors.upstream")
    report["outcomes"] = {
        # each prompt of the version once: a sample or a recorded drop
        "prompts": totals.samples + len(drops),
        "samples": totals.samples,
        "policy_drops": report["policy_drops"]["total"],
        "tokenize_errors": report["errors"]["tokenize"]["total"],
        "upstream_letters": report["errors"]["upstream"]["total"],
    }
    report["supervised_tokens"] = _supervised_tokens(totals.token_counts, tokenizer)
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


def _drift(markers: list[ShardMarker]) -> dict[str, Any]:
    """Samples whose rendering was compared with the server's ids, how many differ, and why."""
    compared = sum(m.compared for m in markers)
    drifted = sum(m.drifted for m in markers)
    causes: Counter[str] = Counter()
    for marker in markers:
        causes.update(marker.drift_causes)
    return {
        "compared": compared,
        "drifted": drifted,
        "rate": round(drifted / compared, 4) if compared else NOT_RECORDED,
        # the most frequent first; each marker keeps only its window's most frequent
        "causes": dict(causes.most_common(REPORT_CAUSES)),
    }


def _supervised_tokens(counts: np.ndarray, tokenizer: Any) -> dict[str, Any]:
    return {
        "total": int(counts.sum()),
        "distinct": int(np.count_nonzero(counts)),
        "top": top_tokens(counts, tokenizer),
        "file": "token_freq.json",
        "note": "token id -> count over loss_mask == 1, every token seen (token_freq.json): "
        "the frequencies an EAGLE-3 draft vocabulary is chosen from (SpecForge's "
        "process_token_dict_to_mappings)",
    }


def _by_source(
    totals: _Totals, drops: dict[str, str], kafka: KafkaFacts | None
) -> dict[str, dict[str, Any]]:
    """Per source: samples, tokens, lengths; with the broker also the drops (the version's
    own, by the source in their letters, plus the earlier stages' letters) and the drop rate,
    drops / (samples + drops)."""
    dropped: Counter[str] = Counter()
    if kafka is not None:
        for prompt_id in drops:
            dropped[kafka.tokenize_sources.get(prompt_id, UNKNOWN_SOURCE)] += 1
        dropped.update(kafka.upstream_by_source)
    result: dict[str, dict[str, Any]] = {}
    for source in sorted(set(totals.by_source) | set(dropped)):
        figures: dict[str, Any] = (
            totals.source_figures(source) if source in totals.by_source else {"samples": 0}
        )
        if kafka is None:
            figures["drops"] = figures["drop_rate"] = NOT_RECORDED
        else:
            figures["drops"] = dropped[source]
            outcomes = figures["samples"] + dropped[source]
            figures["drop_rate"] = round(dropped[source] / outcomes, 4) if outcomes else None
        result[source] = figures
    return result


def _drops(
    drops: dict[str, str], drops_from: str, kafka: KafkaFacts | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(policy drops, errors). The version's own drops (policy and the tokenize stage's
    errors) are its recorded ones, each prompt once; the earlier stages' errors are the
    `dead-letters` topic's letters of those stages (not recorded without a broker)."""
    kinds = Counter(drops.values())
    policy = {k: n for k, n in sorted(kinds.items()) if is_policy_drop(k)}
    tokenize = {f"{TOKENIZE_STAGE}/{k}": n for k, n in sorted(kinds.items()) if k not in policy}
    upstream: dict[str, Any]
    if kafka is not None:
        letters = {
            f"{stage}/{kind}": n
            for (stage, kind), n in sorted(kafka.dead_letters.items())
            if stage != TOKENIZE_STAGE
        }
        upstream = {
            "source": "dead-letters topic: letters of the stages before tokenize (every "
            "version built from these completions shares them)",
            "by_kind": letters,
            "total": sum(letters.values()),
        }
    else:
        upstream = {
            "source": "needs --bootstrap (or a running `draftgen stack`)",
            "by_kind": NOT_RECORDED,
            "total": NOT_RECORDED,
        }
    errors: dict[str, Any] = {
        "tokenize": {"source": drops_from, "by_kind": tokenize, "total": sum(tokenize.values())},
        "upstream": upstream,
        "by_kind": {**tokenize, **upstream["by_kind"]}
        if isinstance(upstream["by_kind"], dict)
        else dict(tokenize),
    }
    errors["total"] = (
        sum(errors["by_kind"].values()) if isinstance(upstream["by_kind"], dict) else NOT_RECORDED
    )
    policy_section = {"source": drops_from, "by_kind": policy, "total": sum(policy.values())}
    return policy_section, errors


__all__ = [
    "LENGTHS",
    "NOT_RECORDED",
    "KafkaFacts",
    "build_report",
    "collect",
    "distribution",
    "distribution_of_counts",
    "letter_source",
    "load_report_tokenizer",
    "read_kafka_facts",
    "sample_lengths",
    "think_close_id",
    "token_frequencies",
    "top_tokens",
]
