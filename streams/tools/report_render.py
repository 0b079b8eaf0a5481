"""The data report as files: `report.json`, PNG plots (matplotlib, Agg backend: no display
needed) and `report.html`, one self-contained page with the plots embedded as base64 (no
script, no outside resource), so it can be mailed or opened from a bucket as is."""

from __future__ import annotations

import base64
import html
import io
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from streams.tools.report import LENGTHS, NOT_RECORDED, token_frequencies

Plot = Callable[[Any], None]


def _figure(draw: Callable[[Any], None], width: float = 9.0, height: float = 5.0) -> Any:
    """One matplotlib Figure drawn by `draw(figure)`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)  # the Agg canvas, not pyplot's global state
    draw(figure)
    return figure


def _png(figure: Any) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _count_axis(axis: Any) -> None:
    """Counts and token lengths are whole numbers: integer ticks only, few enough that their
    labels (with thousands separators) never touch."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    axis.set_major_locator(MaxNLocator(nbins=5, integer=True, min_n_ticks=1))
    axis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:,.0f}"))


def _histogram(axes: Any, name: str, dist: dict[str, Any] | None) -> None:
    axes.set_title(f"{name} length (tokens)")
    if not dist or not dist.get("count"):
        axes.text(0.5, 0.5, "not computed", ha="center", va="center", transform=axes.transAxes)
        axes.set_xticks([])
        axes.set_yticks([])
        return
    edges = dist["histogram"]["edges"]
    counts = dist["histogram"]["counts"]
    widths = [b - a for a, b in itertools.pairwise(edges)]
    axes.bar(edges[:-1], counts, width=widths, align="edge", color="#4C72B0", edgecolor="white")
    axes.axvline(dist["p50"], color="#DD8452", linestyle="--", label=f"median {dist['p50']:g}")
    axes.axvline(dist["p90"], color="#C44E52", linestyle=":", label=f"p90 {dist['p90']:g}")
    axes.set_ylabel("samples")
    _count_axis(axes.xaxis)
    _count_axis(axes.yaxis)
    axes.legend(loc="upper right", fontsize="small")


def _bars(axes: Any, title: str, counts: dict[str, int], color: str) -> None:
    axes.set_title(title)
    labels = list(counts)[:30] or ["(none)"]
    values = [counts.get(label, 0) for label in labels]
    # sources are often file paths: their end says most
    shown = [label if len(label) <= 32 else "…" + label[-31:] for label in labels]
    axes.barh(shown[::-1], values[::-1], color=color)
    for y, value in enumerate(values[::-1]):
        axes.text(value, y, f" {value:,}", va="center", fontsize="small")
    axes.margins(x=0.15)
    _count_axis(axes.xaxis)


def plots(report: dict[str, Any]) -> dict[str, bytes]:
    """name → PNG bytes."""
    return {name: _png(figure) for name, figure in figures(report).items()}


def figures(report: dict[str, Any]) -> dict[str, Any]:
    """name → matplotlib Figure, drawn."""
    lengths = report["lengths"]

    def draw_lengths(figure: Any) -> None:
        for axes, name in zip(figure.subplots(2, 2).flat, LENGTHS, strict=True):
            _histogram(axes, name, lengths.get(name))

    def draw_sources(figure: Any) -> None:
        left, right = figure.subplots(1, 2)
        sources = report["by_source"]
        _bars(left, "samples per source", {s: c["samples"] for s, c in sources.items()}, "#4C72B0")
        _bars(
            right,
            "tokens per source",
            {s: c.get("tokens", 0) for s, c in sources.items()},
            "#55A868",
        )
        right.tick_params(labelleft=False)  # the same sources as on the left

    def draw_finish(figure: Any) -> None:
        _bars(figure.subplots(), "finish reasons", report["finish_reasons"], "#8172B2")

    result = {
        "lengths": _figure(draw_lengths, 10.0, 7.0),
        "sources": _figure(draw_sources, 10.0, _bar_height(report["by_source"])),
        "finish_reasons": _figure(draw_finish, 7.0, _bar_height(report["finish_reasons"])),
    }
    # policy drops and errors of every stage known, by kind (drawn when there are any)
    drops = {**report["policy_drops"]["by_kind"], **report["errors"]["by_kind"]}
    if drops:

        def draw_drops(figure: Any) -> None:
            _bars(figure.subplots(), "policy drops and errors", drops, "#C44E52")

        result["policy_drops"] = _figure(draw_drops, 8.0, _bar_height(drops))
    return result


def _bar_height(counts: dict[str, Any]) -> float:
    return min(2.2 + 0.35 * max(len(counts), 1), 11.0)


# -- HTML ------------------------------------------------------------------------------------

CSS = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { border-bottom: 1px solid #ddd; padding: .25em .8em; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.missing { color: #a33; font-style: italic; }
img { max-width: 100%; border: 1px solid #eee; }
.note { color: #666; font-size: .9em; }
"""


def _cell(value: Any) -> str:
    if value == NOT_RECORDED or value is None:
        return f'<span class="missing">{NOT_RECORDED}</span>'
    if isinstance(value, float):
        return f"{value:,.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return html.escape(str(value))


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _counts(title: str, section: dict[str, Any], unit: str = "prompts") -> str:
    by_kind = section["by_kind"]
    note = f'<p class="note">from: {html.escape(section["source"])}</p>'
    if not isinstance(by_kind, dict):
        return f"<h3>{title}</h3>{note}<p>{_cell(NOT_RECORDED)}</p>"
    rows: list[list[Any]] = [[k, n] for k, n in by_kind.items()] or [["(none)", 0]]
    rows.append(["total", section["total"]])
    return f"<h3>{title}</h3>{note}" + _table(["kind", unit], rows)


def _sources_table(sources: dict[str, dict[str, Any]]) -> str:
    header = ["source", "samples", "tokens", "loss tokens", "mean length", "p50", "p90", "max"]
    header += ["mean generated", "drops", "drop rate"]
    rows = [
        [
            name,
            c["samples"],
            c.get("tokens", 0),
            c.get("loss_tokens", 0),
            c.get("mean_length"),
            c.get("p50_length"),
            c.get("p90_length"),
            c.get("max_length"),
            c.get("mean_generated"),
            c["drops"],
            c["drop_rate"],
        ]
        for name, c in sources.items()
    ]
    return _table(header, rows)


def _tokens_table(section: dict[str, Any]) -> str:
    named = any("token" in row for row in section["top"])
    header = ["token id", *(["token"] if named else []), "count", "share"]
    total = section["total"] or 1
    rows = [
        [row["id"], *([row.get("token", "")] if named else []), row["count"], row["count"] / total]
        for row in section["top"]
    ]
    return _table(header, rows)


def _gate(gate: dict[str, dict[str, Any]]) -> str:
    """Each rule's drops or flags per source, then its examples (the answer's text, cut)."""
    if not gate:
        return "<p>no sample was dropped or flagged by a rule</p>"
    rows = [
        [key.partition(":")[2], key.partition(":")[0], source, count]
        for key, section in gate.items()
        for source, count in section["by_source"].items()
    ]
    parts = [_table(["rule", "verdict", "source", "completions"], rows)]
    for key, section in gate.items():
        if section["examples"]:
            items = "".join(f"<li><code>{html.escape(e)}</code></li>" for e in section["examples"])
            parts.append(f"<h3>{html.escape(key)}: examples</h3><ul>{items}</ul>")
    return "".join(parts)


def _provenance(section: dict[str, Any]) -> str:
    """Samples and tokens per provenance (report_provenance.py), largest first."""
    rows = []
    for group in section["groups"]:
        made = group["provenance"] or {}
        served = made.get("served") or {}
        sampling = dict(made.get("sampling") or {})
        sampling.pop("chat_template_kwargs", None)  # shown as thinking
        hashes = [made.get(k) or "" for k in ("chat_template_sha256", "tokenizer_sha256")]
        rows.append(
            [
                group["samples"],
                group["tokens"],
                (made.get("recipe") or "") if made else NOT_RECORDED,
                made.get("model", ""),
                " ".join(str(served[k]) for k in ("kind", "version", "revision") if k in served),
                "" if made.get("thinking") is None else ("on" if made["thinking"] else "off"),
                ", ".join(f"{k}={v}" for k, v in sorted(sampling.items())),
                made.get("normalization", ""),
                " / ".join(h[:12] for h in hashes),
            ]
        )
    other = section["other"]
    if other["groups"]:
        rows.append([other["samples"], other["tokens"], f"{other['groups']} more groups"])
        rows[-1] += [""] * 6
    header = ["samples", "tokens", "recipe", "model", "served by", "thinking", "sampling sent"]
    header += ["normalization", "template / tokenizer sha256"]
    return _table(header, rows)


def _image(name: str, png: bytes) -> str:
    data = base64.b64encode(png).decode()
    return f'<img id="plot-{name}" alt="{name}" src="data:image/png;base64,{data}">'


def render_html(report: dict[str, Any], pngs: dict[str, bytes]) -> str:
    name = html.escape(report["dataset"])
    parts = [
        *_totals_html(report, pngs, name),
        *_lengths_html(report, pngs),
        *_outcomes_html(report, pngs),
        *_tokens_html(report),
    ]
    body = "\n".join(parts)
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>draftgen report: {name}</title><style>{CSS}</style></head>"
        f"<body>\n{body}\n</body></html>\n"
    )


def _totals_html(report: dict[str, Any], pngs: dict[str, bytes], name: str) -> list[str]:
    return [
        f"<h1>Dataset report: {name}</h1>",
        f'<p class="note">{html.escape(report["url"])} · '
        f"{'sealed' if report['sealed'] else 'committed shards (not sealed)'} · "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(report['created_at']))}</p>",
        "<h2>Totals</h2>",
        _table(
            ["figure", "value"],
            [
                ["samples", report["samples"]],
                ["tokens", report["tokens"]],
                ["loss tokens", report["loss_tokens"]],
                ["loss tokens / tokens", report["loss_fraction"]],
                ["shards", report["shards"]],
                ["truncated (markers)", report["truncated"]],
            ],
        ),
        "<h2>Sources</h2>",
        _sources_table(report["by_source"]),
        '<p class="note">lengths in tokens, prompt included; drop rate = drops / (samples + '
        "drops), drops = this version's recorded drops plus the earlier stages' dead letters, "
        "by the source their letters name (needs the broker)</p>",
        _image("sources", pngs["sources"]),
    ]


def _lengths_html(report: dict[str, Any], pngs: dict[str, bytes]) -> list[str]:
    lengths = report["lengths"]
    length_rows = []
    for key in (*LENGTHS, "generated"):
        dist = lengths.get(key)
        if not dist or not dist.get("count"):
            length_rows.append([key, NOT_RECORDED, None, None, None, None, None])
            continue
        length_rows.append(
            [key, dist["count"], dist["mean"], dist["p50"], dist["p90"], dist["p99"], dist["max"]]
        )
    split = report["reasoning_split"]
    return [
        "<h2>Lengths</h2>",
        f'<p class="note">reasoning / answer {"split at" if split["computed"] else "not split:"} '
        f"{html.escape(split['note'])}; "
        f"samples split {_cell(split['samples_split'])}, without a supervised close "
        f"{_cell(split['samples_without_think_close'])}</p>",
        _table(["part", "samples", "mean", "median", "p90", "p99", "max"], length_rows),
        _image("lengths", pngs["lengths"]),
        "<h2>Finish reasons</h2>",
        _table(["finish reason", "samples"], [[k, n] for k, n in report["finish_reasons"].items()]),
        _image("finish_reasons", pngs["finish_reasons"]),
    ]


def _outcomes_html(report: dict[str, Any], pngs: dict[str, bytes]) -> list[str]:
    outcomes = report["outcomes"]
    return [
        "<h2>Drops and errors</h2>",
        _table(
            ["prompts of this version", "samples", "policy drops", "tokenize errors"],
            [
                [
                    outcomes["prompts"],
                    outcomes["samples"],
                    outcomes["policy_drops"],
                    outcomes["tokenize_errors"],
                ]
            ],
        ),
        _counts("Policy drops", report["policy_drops"]),
        _counts("Errors of the tokenize stage", report["errors"]["tokenize"]),
        _counts(
            "Errors of the stages before (publish, generate)",
            report["errors"]["upstream"],
            unit="dead letters",
        ),
        _image("policy_drops", pngs["policy_drops"]) if "policy_drops" in pngs else "",
        "<h2>Provenance</h2>",
        '<p class="note">what made the samples: each group shares its recipe, model, server, '
        "sampling sent (a sample's seed aside), thinking, normalization and tokenizer</p>",
        _provenance(report["provenance"]),
        "<h2>Quality gate</h2>",
        _gate(report.get("quality_gate", {})),
    ]


def _tokens_html(report: dict[str, Any]) -> list[str]:
    tokens = report["supervised_tokens"]
    drift = report["drift"]
    dup = report["duplicates"]
    return [
        "<h2>Supervised tokens</h2>",
        f'<p class="note">{html.escape(tokens["note"])}; {tokens["total"]:,} supervised '
        f"tokens, {tokens['distinct']:,} distinct; the {len(tokens['top'])} most frequent:</p>",
        _tokens_table(tokens),
        "<h2>Drift</h2>",
        _table(
            ["compared", "drifted", "rate"],
            [[drift["compared"], drift["drifted"], drift["rate"]]],
        ),
        _table(["cause", "samples"], [[k, n] for k, n in drift["causes"].items()])
        if drift.get("causes")
        else "",
        "<h2>Duplicates</h2>",
        _table(
            ["in the version", "excluded by the seal", "removed by the tokenize stage"],
            [
                [
                    dup["duplicate_ids_in_version"],
                    dup["excluded_by_seal"],
                    dup["removed_by_tokenize"],
                ]
            ],
        ),
        f'<p class="note">{html.escape(dup["note"])}</p>',
        "<h2>Not recorded</h2>",
        "<p>"
        + (", ".join(html.escape(n) for n in report["not_recorded"]) or "everything was")
        + "</p>",
    ]


def write_report(
    report: dict[str, Any], directory: Path, token_counts: np.ndarray | None = None
) -> dict[str, Path]:
    """Write report.json, one PNG per plot, report.html and, given the supervised-token counts,
    token_freq.json (token id → count, SpecForge's `token_dict`); return name → path."""
    directory.mkdir(parents=True, exist_ok=True)
    pngs = plots(report)
    written = {"json": directory / "report.json", "html": directory / "report.html"}
    written["json"].write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    if token_counts is not None:
        written["token_freq"] = directory / report["supervised_tokens"]["file"]
        written["token_freq"].write_bytes(orjson.dumps(token_frequencies(token_counts)))
    for name, png in pngs.items():
        path = directory / f"{name}.png"
        path.write_bytes(png)
        written[name] = path
    written["html"].write_text(render_html(report, pngs), encoding="utf-8")
    return written


__all__ = ["figures", "plots", "render_html", "write_report"]
