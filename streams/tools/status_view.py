"""What `draftgen status` shows, as plain data: the arithmetic (lag, per-server aggregates of
heartbeats, ETA). Its rendering (aligned text, JSON) is status_render.py. No I/O here."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from streams.observe.figures import Figure
from streams.observe.heartbeat import Heartbeat
from streams.tools import worker_figures as fig

# A worker whose last heartbeat is older than this is not shown at all (it is long gone).
FORGET_AFTER_S = 600.0


@dataclass
class DatasetRow:
    dataset: str
    samples: int
    tokens: int
    loss_tokens: int
    shards: int
    duplicates: int
    # drift report (JSON only): samples compared with the server's ids, drifted, top causes
    compared: int = 0
    drifted: int = 0
    drift_causes: dict[str, int] = field(default_factory=dict)
    # samples by the SGLang preprocessing profile their prompt was rendered with
    # (streams/core/serving/; "" for completions written before profiles)
    normalizations: dict[str, int] = field(default_factory=dict)
    # the version's recorded drops (policy_* and the tokenize stage's errors), by kind: each
    # prompt once, unlike the dead-letters topic, which every version under the prefix shares
    drops: dict[str, int] = field(default_factory=dict)


@dataclass
class GroupLag:
    group: str
    topic: str  # without the topic prefix: prompts | completions
    committed: int  # summed over partitions; a partition with no commit counts from its start
    end: int
    lag: int
    # a sealed version's group: done, whatever it has not read (no backlog: nothing waits)
    sealed: bool = False


@dataclass
class ServerRow:
    """One SGLang server: the sum of its live generate workers' latest heartbeats."""

    server: str
    workers: int
    stale: bool  # no live worker, only recent stale heartbeats
    in_flight: int
    paused: bool
    # why, when paused: "auth" (the server refuses the API key) or "down"
    paused_for: str | None
    requests_per_s: float
    completed_per_s: float
    dead_letters_per_s: float
    output_tokens_per_s: float
    error_rate: float | None  # failed / sent over the rate window; None: nothing sent
    requests: int
    completed: int
    dead_letters: int
    output_tokens: int
    errors: dict[str, int]
    last_seen_s: float
    metrics_urls: list[str]
    # how the server returns exact token ids, as its workers found (None: not known yet)
    exact_ids: str | None = None


@dataclass
class TokenizerRow:
    dataset: str
    workers: int
    stale: bool
    samples_per_s: float
    tokens_per_s: float
    samples: int
    tokens: int
    duplicates: int
    dead_letters: int
    last_seen_s: float
    metrics_urls: list[str]


@dataclass
class Eta:
    remaining: int | None  # prompts not yet done by the generate group (its lag)
    rate_per_s: float | None  # prompts finished per second, recently
    rate_basis: str  # heartbeats | offsets | none
    seconds: float | None  # None: unknown (no rate yet)


@dataclass
class StatusSnapshot:
    time: float
    bootstrap: str
    topic_prefix: str
    published: int  # sum of the prompts topic's end offsets: every record ever written
    completions: int  # the same for completions
    out: str | None = None
    datasets: list[DatasetRow] = field(default_factory=list)
    dead_letters: dict[tuple[str, str], int] = field(default_factory=dict)
    groups: list[GroupLag] = field(default_factory=list)
    servers: list[ServerRow] = field(default_factory=list)
    tokenizers: list[TokenizerRow] = field(default_factory=list)
    eta: Eta = field(default_factory=lambda: Eta(None, None, "none", None))


# -- arithmetic ----------------------------------------------------------------------------------


def group_lag(
    group: str,
    topic: str,
    committed: dict[int, int],
    beginning: dict[int, int],
    end: dict[int, int],
) -> GroupLag:
    """Lag of one group on one topic. A partition the group never committed (or whose commit
    fell behind retention) is counted from the partition's first retained offset."""
    done = 0
    lag = 0
    for partition, last in end.items():
        start = beginning.get(partition, 0)
        position = committed.get(partition, -1)
        position = start if position < start else min(position, last)
        done += position
        lag += last - position
    return GroupLag(group, topic, done, sum(end.values()), lag)


def _split_by_label(
    beats: Iterable[Heartbeat], role: str, now: float
) -> dict[str, tuple[list[Heartbeat], list[Heartbeat]]]:
    """label -> (live heartbeats, stale-but-recent heartbeats)."""
    by_label: dict[str, tuple[list[Heartbeat], list[Heartbeat]]] = {}
    for beat in beats:
        if beat.role != role or beat.age(now) > FORGET_AFTER_S:
            continue
        live, stale = by_label.setdefault(beat.label, ([], []))
        (live if beat.live(now) else stale).append(beat)
    return by_label


def _sum(beats: Sequence[Heartbeat], declared: Figure) -> float:
    return sum(b.figure(declared) for b in beats)


def _rate(beats: Sequence[Heartbeat], declared: Figure) -> float:
    return sum(b.rate(declared) for b in beats)


def server_rows(beats: Iterable[Heartbeat], now: float) -> list[ServerRow]:
    rows = []
    for server, (live, stale) in sorted(_split_by_label(beats, "generate", now).items()):
        # Rates and gauges only from live workers; a stale worker's last counters still tell
        # what it did, so they are shown when it is all there is.
        shown = live or [max(stale, key=lambda b: b.time)]
        requests_rate = _rate(live, fig.REQUESTS)
        errors: dict[str, int] = {}
        for beat in shown:
            for kind, times in beat.errors.items():
                errors[kind] = errors.get(kind, 0) + int(times)
        rows.append(
            ServerRow(
                server=server,
                workers=len(live),
                stale=not live,
                in_flight=int(_sum(live, fig.IN_FLIGHT)),
                paused=any(b.figure(fig.PAUSED) for b in live),
                paused_for=_paused_for(live),
                requests_per_s=requests_rate,
                completed_per_s=_rate(live, fig.COMPLETED),
                dead_letters_per_s=_rate(live, fig.DEAD_LETTERS),
                output_tokens_per_s=_rate(live, fig.OUTPUT_TOKENS),
                error_rate=(_rate(live, fig.FAILED) / requests_rate if requests_rate > 0 else None),
                requests=int(_sum(shown, fig.REQUESTS)),
                completed=int(_sum(shown, fig.COMPLETED)),
                dead_letters=int(_sum(shown, fig.DEAD_LETTERS)),
                output_tokens=int(_sum(shown, fig.OUTPUT_TOKENS)),
                errors=errors,
                last_seen_s=min(b.age(now) for b in shown),
                metrics_urls=sorted(b.metrics_url for b in shown if b.metrics_url),
                exact_ids=next((n for b in shown if (n := b.notes.get(fig.EXACT_IDS))), None),
            )
        )
    return rows


def _paused_for(live: Sequence[Heartbeat]) -> str | None:
    return fig.paused_state(live) or None


def tokenizer_rows(beats: Iterable[Heartbeat], now: float) -> list[TokenizerRow]:
    rows = []
    for dataset, (live, stale) in sorted(_split_by_label(beats, "tokenize", now).items()):
        shown = live or [max(stale, key=lambda b: b.time)]
        rows.append(
            TokenizerRow(
                dataset=dataset,
                workers=len(live),
                stale=not live,
                samples_per_s=_rate(live, fig.SAMPLES),
                tokens_per_s=_rate(live, fig.TOKENS),
                samples=int(_sum(shown, fig.SAMPLES)),
                tokens=int(_sum(shown, fig.TOKENS)),
                duplicates=int(_sum(shown, fig.DUPLICATES)),
                dead_letters=int(_sum(shown, fig.LETTERED)),
                last_seen_s=min(b.age(now) for b in shown),
                metrics_urls=sorted(b.metrics_url for b in shown if b.metrics_url),
            )
        )
    return rows


def finish_rate(servers: Sequence[ServerRow]) -> float | None:
    """Prompts finished per second (completed or dead-lettered) by live generate workers."""
    live = [s for s in servers if not s.stale]
    if not live:
        return None
    return sum(s.completed_per_s + s.dead_letters_per_s for s in live)


def estimate(
    remaining: int | None, heartbeat_rate: float | None, offsets_rate: float | None = None
) -> Eta:
    """remaining / recent rate. Heartbeats give the rate at once; without live heartbeats,
    `--watch` can still derive one from how fast the completions topic grew between refreshes."""
    if heartbeat_rate is not None:
        rate, basis = heartbeat_rate, "heartbeats"
    elif offsets_rate is not None:
        rate, basis = offsets_rate, "offsets"
    else:
        rate, basis = None, "none"
    if remaining is None:
        seconds = None
    elif remaining <= 0:
        seconds = 0.0
    elif rate is None or rate <= 0:
        seconds = None
    else:
        seconds = remaining / rate
    return Eta(remaining, rate, basis, seconds)


# -- text ----------------------------------------------------------------------------------------
