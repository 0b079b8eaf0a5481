"""The metrics table of docs/operations.md is generated from the stats' declarations
(streams/tools/metrics_table.py) and kept current."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from streams.generate.stats import GenerateStats
from streams.observe.figures import declared
from streams.tokenize.stats import TokenizeStats
from streams.tools.metrics_table import BEGIN, END, main, metrics_table, with_table

ROOT = Path(__file__).resolve().parents[3]


def test_the_metrics_table_of_the_operations_page_is_current() -> None:
    page = (ROOT / "docs" / "operations.md").read_text()
    assert with_table(page) == page, (
        "docs/operations.md's metrics table differs from the stats' declarations; regenerate "
        f"it from the repository root: {Path(sys.executable).name} -m streams.tools.metrics_table"
        f" (here: cd {ROOT} && {sys.executable} -m streams.tools.metrics_table)"
    )


def test_every_declared_figure_has_its_row() -> None:
    table = metrics_table()
    for figure in (*declared(GenerateStats), *declared(TokenizeStats)):
        assert f"| `{figure.key}` | {figure.doc} |" in table
    # the ones the hand-written table lacked
    for metric in (
        "draftgen_generate_skipped_total",
        "draftgen_generate_stolen_total",
        "draftgen_generate_refused_total",
        "draftgen_tokenize_open_bytes",
        "draftgen_tokenize_peak_open_bytes",
    ):
        assert f"| `{metric}` |" in table
    assert "| `draftgen_generate_errors_total` | counter, by kind | `server`, `kind` |" in table
    assert "| `draftgen_generate_request_duration_seconds` | histogram |" in table


def test_only_the_text_between_the_markers_is_rewritten(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"before\n\n{BEGIN}\n| old | table |\n{END}\n\nafter\n")
    assert main([str(page)]) == 0
    text = page.read_text()
    assert text == f"before\n\n{BEGIN}\n{metrics_table()}\n{END}\n\nafter\n"
    main([str(page)])
    assert page.read_text() == text  # current: left as it is
    with pytest.raises(ValueError, match="markers"):
        with_table("no table here")
