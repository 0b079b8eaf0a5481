"""How `draftgen status` shows its snapshot (status_view.py): aligned text, a section at a time,
and JSON. No I/O here."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from streams.tools.formatting import count, duration, percent, rate, table
from streams.tools.status_view import StatusSnapshot


def _normalizations(counts: dict[str, int]) -> str:
    """`sglang-0.5.23` for one profile, else each with its samples; `-` for none recorded."""
    named = {name or "unrecorded": n for name, n in counts.items() if n}
    if not named:
        return "-"
    if len(named) == 1:
        return next(iter(named))
    return ", ".join(f"{name} {n:,}" for name, n in sorted(named.items()))


def render_text(snapshot: StatusSnapshot) -> str:
    s = snapshot
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.time))
    prefix = f" · prefix {s.topic_prefix}" if s.topic_prefix else ""
    lines = [f"draftgen status · {stamp} · kafka {s.bootstrap}{prefix}", ""]
    for section in (_summary, _datasets, _dead_letters, _lag, _servers, _tokenizers):
        lines += section(s)
    return "\n".join(lines)


def _summary(s: StatusSnapshot) -> list[str]:
    """What was published and done, and when the rest will be."""
    lines: list[str] = []
    eta = s.eta
    summary = [
        ("prompts published", count(s.published), "records written to the prompts topic"),
        ("completions", count(s.completions), "records written to the completions topic"),
    ]
    if eta.remaining is not None:
        summary.append(("remaining", count(eta.remaining), "prompts not yet done (generate lag)"))
    eta_note = f"at {rate(eta.rate_per_s)} prompts/s" if eta.rate_per_s is not None else ""
    if eta.rate_per_s is not None and eta.rate_basis == "offsets":
        eta_note += " (from completions offsets)"
    summary.append(("ETA", duration(eta.seconds), eta_note))
    width = max(len(name) for name, _, _ in summary)
    value_width = max(len(value) for _, value, _ in summary)
    for name, value, note in summary:
        lines.append(f"{name.ljust(width)}  {value.rjust(value_width)}  {note}".rstrip())
    return lines


def _datasets(s: StatusSnapshot) -> list[str]:
    """The dataset versions in the storage root."""
    lines: list[str] = []
    if s.out is not None:
        lines += ["", f"datasets in {s.out}"]
        if s.datasets:
            lines += table(
                [
                    "dataset",
                    "samples",
                    "tokens",
                    "loss tokens",
                    "shards",
                    "duplicates",
                    "dropped",
                    "rendered as",
                ],
                [
                    [
                        d.dataset,
                        count(d.samples),
                        count(d.tokens),
                        count(d.loss_tokens),
                        count(d.shards),
                        count(d.duplicates),
                        count(sum(d.drops.values())),
                        _normalizations(d.normalizations),
                    ]
                    for d in s.datasets
                ],
            )
        else:
            lines.append("  none found")
    return lines


def _dead_letters(s: StatusSnapshot) -> list[str]:
    """Dead letters by stage and reason."""
    lines: list[str] = []
    total = sum(s.dead_letters.values())
    lines += ["", f"dead letters  {count(total)}"]
    if s.dead_letters:
        lines += table(
            ["stage", "reason", "count"],
            [[stage, kind, count(n)] for (stage, kind), n in sorted(s.dead_letters.items())],
        )
    return lines


def _lag(s: StatusSnapshot) -> list[str]:
    """Each consumer group's lag, live groups first."""
    lines = ["", "consumer lag"]
    if s.groups:
        # live groups first; a sealed version's group last, with no lag: nothing waits on it
        ordered = sorted(s.groups, key=lambda g: g.sealed)
        lines += table(
            ["group", "topic", "committed", "end", "lag"],
            [
                [
                    g.group,
                    g.topic,
                    count(g.committed),
                    count(g.end),
                    "sealed" if g.sealed else count(g.lag),
                ]
                for g in ordered
            ],
        )
    else:
        lines.append("  no consumer groups yet")
    return lines


def _servers(s: StatusSnapshot) -> list[str]:
    """The generate workers, by server."""
    lines = ["", "servers"]
    if s.servers:
        lines += table(
            [
                "server",
                "workers",
                "in flight",
                "req/s",
                "out tok/s",
                "err rate",
                "completed",
                "paused",
                "exact ids",
                "last seen",
            ],
            [
                [
                    r.server,
                    str(r.workers) if not r.stale else "stale",
                    count(r.in_flight),
                    rate(r.requests_per_s),
                    rate(r.output_tokens_per_s),
                    percent(r.error_rate),
                    count(r.completed),
                    f"yes ({r.paused_for})" if r.paused else "no",
                    r.exact_ids or "-",
                    f"{r.last_seen_s:.0f}s ago",
                ]
                for r in s.servers
            ],
        )
    else:
        lines.append("  no generate worker heartbeats")
    return lines


def _tokenizers(s: StatusSnapshot) -> list[str]:
    """The tokenize workers, by dataset version."""
    lines: list[str] = []
    if s.tokenizers:
        lines += ["", "tokenize workers"]
        lines += table(
            ["dataset", "workers", "samples/s", "tokens/s", "samples", "dead letters", "last seen"],
            [
                [
                    t.dataset,
                    str(t.workers) if not t.stale else "stale",
                    rate(t.samples_per_s),
                    rate(t.tokens_per_s),
                    count(t.samples),
                    count(t.dead_letters),
                    f"{t.last_seen_s:.0f}s ago",
                ]
                for t in s.tokenizers
            ],
        )
    return lines


# -- JSON ----------------------------------------------------------------------------------------


def to_json(snapshot: StatusSnapshot) -> dict[str, Any]:
    s = snapshot
    by_stage: dict[str, dict[str, int]] = {}
    for (stage, kind), n in sorted(s.dead_letters.items()):
        by_stage.setdefault(stage, {})[kind] = n
    return {
        "time": s.time,
        "bootstrap": s.bootstrap,
        "topic_prefix": s.topic_prefix,
        "prompts": {
            "published": s.published,
            "basis": "sum of the prompts topic's end offsets (every record written)",
        },
        "completions": s.completions,
        "out": s.out,
        "datasets": {d.dataset: _without(asdict(d), "dataset") for d in s.datasets},
        "dead_letters": {"total": sum(s.dead_letters.values()), "by_stage": by_stage},
        "groups": {
            g.group: {
                "topic": g.topic,
                "committed": g.committed,
                "end": g.end,
                "lag": None if g.sealed else g.lag,
                "sealed": g.sealed,
            }
            for g in s.groups
        },
        "servers": {r.server: _without(asdict(r), "server") for r in s.servers},
        "tokenizers": {t.dataset: _without(asdict(t), "dataset") for t in s.tokenizers},
        "eta": asdict(s.eta),
    }


def _without(data: dict[str, Any], key: str) -> dict[str, Any]:
    data.pop(key, None)
    return data
