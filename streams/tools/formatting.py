"""How `status` writes its figures as text: durations, counts, rates, aligned columns."""

from __future__ import annotations

from collections.abc import Sequence


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds <= 0:
        return "done"
    total = round(seconds)
    if total < 60:
        return f"{max(total, 1)}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


def count(value: int) -> str:
    return f"{value:,}"


def rate(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Aligned columns: numbers right-aligned; the first column and the `_LEFT` ones (words)
    left-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        for index, cell in enumerate(row):
            widths[index] = max(widths[index], len(cell))
    left = [index == 0 or headers[index] in _LEFT for index in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.ljust(widths[i]) if left[i] else cell.rjust(widths[i])
            for i, cell in enumerate(cells)
        ]
        return (indent + "  ".join(parts)).rstrip()

    return [line(headers), *(line(row) for row in rows)]


_LEFT = {"topic", "reason", "paused", "metrics"}
