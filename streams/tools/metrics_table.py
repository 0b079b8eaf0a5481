"""The metrics table of docs/operations.md, generated from the figures the stats declare
(streams/observe/figures.py), so the page lists every figure a worker exports.

    python -m streams.tools.metrics_table [docs/operations.md]

rewrites the table between its two marker comments; tests/streams/tools/test_metrics_table.py
fails while the page is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from streams.generate.stats import GenerateStats
from streams.observe.figures import Figure, declared
from streams.observe.metrics import (
    KIND_LABEL,
    LATENCY_DOC,
    LATENCY_METRIC,
    GenerateMetrics,
    TokenizeMetrics,
)
from streams.tokenize.stats import TokenizeStats

PAGE = Path("docs/operations.md")
BEGIN = (
    "<!-- metrics table: generated from the stats by `python -m streams.tools.metrics_table` -->"
)
END = "<!-- end of the metrics table -->"


def _labels(*names: str) -> str:
    return ", ".join(f"`{name}`" for name in names)


def _row(figure: Figure, label: str) -> str:
    exposed = f"{figure.metric}_total" if figure.kind == "counter" else figure.metric
    labels = _labels(label, KIND_LABEL) if figure.by_kind else _labels(label)
    kind = f"{figure.kind}, by kind" if figure.by_kind else figure.kind
    return f"| `{exposed}` | {kind} | {labels} | `{figure.key}` | {figure.doc} |"


def metrics_table() -> str:
    rows = ["| metric | kind | labels | in heartbeats | what |", "|---|---|---|---|---|"]
    rows += [_row(f, GenerateMetrics.LABEL) for f in declared(GenerateStats)]
    rows.append(
        f"| `{LATENCY_METRIC}` | histogram | {_labels(GenerateMetrics.LABEL)} | - | {LATENCY_DOC} |"
    )
    rows += [_row(f, TokenizeMetrics.LABEL) for f in declared(TokenizeStats)]
    return "\n".join(rows)


def with_table(page: str) -> str:
    """The page with the table between the markers made current."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the page has no metrics table markers ({BEGIN} … {END})")
    return f"{page[: start + len(BEGIN)]}\n{metrics_table()}\n{page[end:]}"


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else PAGE
    page = path.read_text()
    current = with_table(page)
    if current != page:
        path.write_text(current)
        print(f"{path}: metrics table updated")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
