"""The report's quality-gate section: every rule's verdicts (drops and flags) per source, and a
few examples of each, from the commit markers that count (streams/tokenize/policies.py)."""

from __future__ import annotations

from typing import Any

from sinks.reader import DatasetReader

# examples shown per rule and verdict
REPORT_GATE_EXAMPLES = 3


def version_gate(reader: DatasetReader) -> dict[str, Any]:
    """ "drop:RULE"/"flag:RULE" → {total, by_source, examples}, largest total first. Counted
    over the windows that count (the sealed ones for a sealed version); a prompt answered
    twice is counted per answer judged."""
    store = reader.store
    resolution = store.committed(store.sealed_offsets(), keep_ids=False)
    counts: dict[str, dict[str, int]] = {}
    examples: dict[str, list[str]] = {}
    for marker in resolution.windows:
        for key, by_source in marker.gate.items():
            mine = counts.setdefault(key, {})
            for source, count in by_source.items():
                mine[source] = mine.get(source, 0) + count
        for key, shown in marker.gate_examples.items():
            room = REPORT_GATE_EXAMPLES - len(examples.setdefault(key, []))
            examples[key] += shown[:room]
    ordered = sorted(counts, key=lambda key: (-sum(counts[key].values()), key))
    return {
        key: {
            "total": sum(counts[key].values()),
            "by_source": dict(sorted(counts[key].items(), key=lambda kv: (-kv[1], kv[0]))),
            "examples": examples.get(key, []),
        }
        for key in ordered
    }
