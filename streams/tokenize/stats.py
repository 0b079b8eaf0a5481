"""A tokenize worker's counters, each field declaring its figure once (streams/observe/figures.py):
its heartbeat key and its Prometheus name. Its own module, so what reads the figures (status,
the console) does not import the stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from sinks.sink import SinkStats
from streams.observe.figures import Figure, figure, figured


@dataclass
class TokenizeStats:
    samples: int = figure("draftgen_tokenize_samples", "samples in committed shards")
    tokens: int = figure("draftgen_tokenize_tokens", "tokens in committed shards")
    loss_tokens: int = figure("draftgen_tokenize_loss_tokens", "loss-masked tokens")
    shards: int = figure(
        "draftgen_tokenize_shards", "shard files committed with rows (a flush's windows share one)"
    )
    dead_letters: int = figure("draftgen_tokenize_dead_letters", "completions dead-lettered")
    drifted: int = figure("draftgen_tokenize_drifted", "samples whose renderings drifted")
    drift_compared: int = figure("draftgen_tokenize_drift_compared", "samples compared")
    errors: dict[str, int] = field(
        default_factory=dict,
        metadata=figured(
            Figure("", "draftgen_tokenize_errors", "samples rejected, by kind", by_kind=True)
        ),
    )
    # the sink's own counters (its stats object, once the worker made its sink)
    sink: SinkStats = field(
        default_factory=SinkStats,
        metadata=figured(
            Figure(
                "duplicates",
                "draftgen_tokenize_duplicates",
                "completions replaced by a later one",
                attr="duplicates",
            ),
            Figure(
                "open_bytes",
                "draftgen_tokenize_open_bytes",
                "bytes held by open windows",
                "gauge",
                attr="open_bytes",
            ),
            Figure(
                "peak_open_bytes",
                "draftgen_tokenize_peak_open_bytes",
                "most held at once",
                "gauge",
                attr="peak_open_bytes",
            ),
        ),
    )
