"""A worker's figures, each declared once: as metadata on the field of its stats dataclass.

`figure(...)` declares a field's heartbeat key (the field's name unless told), Prometheus name,
help text and kind; `read_figures(stats)` reads every declared figure of one stats object for a
heartbeat or a scrape, and `declared(type)` lists them for the Prometheus collector
(streams/observe/metrics.py). A dict field (errors by kind, `by_kind`) is one counter, its sum,
and the errors of the reading; `note()` marks a text field that heartbeats show when it is set.

What reads a heartbeat names a figure by its field, `figure_of(GenerateStats, lambda s:
s.completed)`, never by its key: renaming the field is then a type error where it is read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

Kind = Literal["counter", "gauge"]
S = TypeVar("S")

_FIGURES = "figures"
_NOTE = "note"


@dataclass(frozen=True)
class Figure:
    key: str  # name in heartbeats and `status --json`
    metric: str  # Prometheus name (counters get `_total` on exposition)
    doc: str
    kind: Kind = "counter"
    attr: str = ""  # read this attribute of the field's value (a nested stats object)
    value: Callable[[Any], float] | None = None  # the figure from the field's value
    by_kind: bool = False  # a dict of counts by kind: the counter is its sum


@dataclass
class Figures:
    """One reading of a worker: cumulative counters, current gauges, errors by kind."""

    counters: dict[str, int] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    # facts worth a line, not a number (a server's way of returning exact ids); heartbeats only
    notes: dict[str, str] = field(default_factory=dict)


def figure(
    metric: str,
    doc: str,
    kind: Kind = "counter",
    *,
    key: str = "",
    default: Any = 0,
    value: Callable[[Any], float] | None = None,
) -> Any:
    """A stats field of an immutable type that is one figure."""
    return field(default=default, metadata=figured(Figure(key, metric, doc, kind, value=value)))


def figured(*declared: Figure) -> dict[str, Any]:
    """The metadata of a stats field that is these figures: a dict of errors by kind, or a
    nested stats object some of whose attributes (`Figure.attr`) are figures. A `key` left
    empty is the field's name."""
    return {_FIGURES: declared}


def note(default: str = "") -> Any:
    return field(default=default, metadata={_NOTE: True})


def _fields(stats: Any) -> list[tuple[dataclasses.Field[Any], Figure]]:
    found = []
    for f in dataclasses.fields(stats):
        for declared_figure in f.metadata.get(_FIGURES, ()):
            found.append(
                (f, dataclasses.replace(declared_figure, key=declared_figure.key or f.name))
            )
    return found


def declared(stats_type: type) -> tuple[Figure, ...]:
    return tuple(fig for _, fig in _fields(stats_type))


class _Path:
    """Records the attributes read off it: the field (and attribute) a `pick` names."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def __getattr__(self, name: str) -> _Path:
        self.names.append(name)
        return self


def _picked(pick: Callable[[S], object]) -> list[str]:
    path = _Path()
    pick(path)  # type: ignore[arg-type]  # stands in for the stats object: reads names only
    return path.names


def figure_of(stats_type: type[S], pick: Callable[[S], object]) -> Figure:
    """The figure declared on the field `pick` reads: `lambda s: s.completed`, or an attribute
    of a nested stats object, `lambda s: s.sink.duplicates`. Raises LookupError when the field
    declares no such figure (a test fails on import, as mypy fails on a renamed field)."""
    names = _picked(pick)
    attr = ".".join(names[1:])
    for f, fig in _fields(stats_type):
        if names[:1] == [f.name] and fig.attr == attr:
            return fig
    raise LookupError(f"{stats_type.__name__}.{'.'.join(names)} declares no figure")


def note_of(stats_type: type[S], pick: Callable[[S], str]) -> str:
    """The heartbeat key of the `note()` field `pick` reads (`lambda s: s.exact_ids`)."""
    names = _picked(pick)
    for f in dataclasses.fields(stats_type):  # type: ignore[arg-type]  # a dataclass type
        if names == [f.name] and f.metadata.get(_NOTE):
            return f.name
    raise LookupError(f"{stats_type.__name__}.{'.'.join(names)} is not a note")


def read_figures(stats: Any) -> Figures:
    reading = Figures()
    for f, fig in _fields(stats):
        value = getattr(stats, f.name)
        if fig.attr:
            value = getattr(value, fig.attr)
        if fig.value is not None:
            value = fig.value(value)
        if fig.by_kind:
            reading.errors = dict(value)
            reading.counters[fig.key] = sum(value.values())
        elif fig.kind == "gauge":
            reading.gauges[fig.key] = float(value)
        else:
            reading.counters[fig.key] = int(value)
    for f in dataclasses.fields(stats):
        if f.metadata.get(_NOTE) and getattr(stats, f.name):
            reading.notes[f.name] = getattr(stats, f.name)
    return reading
