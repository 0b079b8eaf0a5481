"""The report's provenance section: samples and tokens per distinct provenance (the shards'
`provenance` column, CompletionRecord.provenance), so a dataset mixed from recipes, thinking
modes, servers or tokenizers shows what each part was made with.

A sample's seed is left out of its group (each sample of a recipe has its own, seed + k), and
so is nothing else: two groups differ in something that changes the output."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pyarrow as pa

# groups the report lists, largest first; the rest are summed as one
REPORT_PROVENANCES = 30
# the group of rows written before the column existed (null provenance)
UNRECORDED = "null"


def provenance_group(text: str | None) -> str:
    """A row's provenance without its seed, as sorted JSON: the key samples are grouped by."""
    if text is None:
        return UNRECORDED
    fields = orjson.loads(text)
    sampling = fields.get("sampling")
    if isinstance(sampling, dict) and "seed" in sampling:
        fields["sampling"] = {k: v for k, v in sampling.items() if k != "seed"}
    return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS).decode()


class ProvenanceTotals:
    """Samples and tokens per provenance group, a shard at a time: each shard's distinct
    values are parsed once (pyarrow groups the rows), not each row's."""

    def __init__(self) -> None:
        self.samples: Counter[str] = Counter()
        self.tokens: Counter[str] = Counter()

    def add(self, table: pa.Table) -> None:
        """One shard's rows, as the reader gives them (sinks/shards.py `conform`: a shard
        written before the column has it as nulls)."""
        grouped = table.group_by("provenance").aggregate([("num_tokens", "sum"), ([], "count_all")])
        for row in grouped.to_pylist():
            key = provenance_group(row["provenance"])
            self.samples[key] += row["count_all"]
            self.tokens[key] += row["num_tokens_sum"]

    def section(self, top: int = REPORT_PROVENANCES) -> dict[str, Any]:
        """{groups: [{samples, tokens, provenance}], largest first, at most `top`; other: the
        rest's samples and tokens}."""
        ordered = sorted(self.samples, key=lambda key: (-self.samples[key], key))
        groups = [
            {
                "samples": self.samples[key],
                "tokens": self.tokens[key],
                "provenance": None if key == UNRECORDED else orjson.loads(key),
            }
            for key in ordered[:top]
        ]
        rest = ordered[top:]
        return {
            "groups": groups,
            "other": {
                "groups": len(rest),
                "samples": sum(self.samples[key] for key in rest),
                "tokens": sum(self.tokens[key] for key in rest),
            },
        }
