"""`draftgen status` arithmetic and rendering: lag, heartbeat aggregation, ETA, text, JSON."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from sinks.shards import SampleRow, ShardStore
from streams.cli.flags import build
from streams.cli.main import build_parser
from streams.core.errors import CliError
from streams.core.settings import WORKER_STATS, KafkaSettings, ObserveSettings, StatusSettings
from streams.core.topics import _PARTITIONS, topic_configs
from streams.generate.stats import GenerateStats, generate_figures
from streams.observe.figures import Figures, read_figures
from streams.observe.heartbeat import Heartbeat, HeartbeatReader, RateWindow, new_heartbeat, refresh
from streams.tokenize.stats import TokenizeStats
from streams.tools.formatting import duration, table
from streams.tools.status import StatusProbe
from streams.tools.status_render import render_text, to_json
from streams.tools.status_view import (
    FORGET_AFTER_S,
    DatasetRow,
    StatusSnapshot,
    estimate,
    finish_rate,
    group_lag,
    server_rows,
    tokenizer_rows,
)

NOW = 1_000_000.0


def beat(
    label: str = "http://gpu-01:30000",
    worker: str = "w1",
    age: float = 1.0,
    role: str = "generate",
    interval: float = 5.0,
    **sections: dict,
) -> Heartbeat:
    return Heartbeat(
        role=role,
        label=label,
        worker=worker,
        time=NOW - age,
        interval_s=interval,
        started_at=NOW - 100,
        counters=sections.get("counters", {}),
        gauges=sections.get("gauges", {}),
        rates=sections.get("rates", {}),
        errors=sections.get("errors", {}),
        metrics_url=sections.get("url"),  # type: ignore[arg-type]
    )


# -- ETA -----------------------------------------------------------------------------------------


def test_eta_is_remaining_over_rate() -> None:
    eta = estimate(1200, 4.0)
    assert eta.seconds == 300.0 and eta.rate_basis == "heartbeats"
    assert duration(eta.seconds) == "5m 00s"


def test_eta_prefers_heartbeats_and_falls_back_to_offsets() -> None:
    assert estimate(10, 2.0, 5.0).rate_per_s == 2.0
    eta = estimate(10, None, 5.0)
    assert (eta.rate_per_s, eta.rate_basis, eta.seconds) == (5.0, "offsets", 2.0)


def test_eta_is_unknown_without_a_rate_and_done_with_nothing_left() -> None:
    assert estimate(10, None).seconds is None
    assert estimate(10, 0.0).seconds is None  # stalled: no finite estimate
    assert estimate(0, None).seconds == 0.0
    assert estimate(None, 3.0).seconds is None  # no generate group to measure


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "unknown"),
        (0, "done"),
        (0.3, "1s"),
        (59.4, "59s"),
        (61, "1m 01s"),
        (3 * 3600 + 125, "3h 02m"),
        (47 * 3600, "47h 00m"),
        (3 * 86400 + 7200, "3d 02h"),
    ],
)
def test_duration(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


# -- lag -----------------------------------------------------------------------------------------


def test_lag_counts_uncommitted_partitions_from_their_start() -> None:
    lag = group_lag(
        "g",
        "prompts",
        committed={0: 10, 1: -1},  # partition 2: no commit at all
        beginning={0: 0, 1: 0, 2: 5},
        end={0: 12, 1: 7, 2: 9},
    )
    assert (lag.committed, lag.end, lag.lag) == (10 + 0 + 5, 28, 2 + 7 + 4)


def test_lag_of_a_commit_behind_retention_starts_at_the_retained_start() -> None:
    lag = group_lag("g", "prompts", {0: 3}, {0: 8}, {0: 10})
    assert lag.lag == 2


def test_lag_is_zero_when_caught_up_and_on_empty_topics() -> None:
    assert group_lag("g", "c", {0: 4, 1: 6}, {0: 0, 1: 0}, {0: 4, 1: 6}).lag == 0
    assert group_lag("g", "c", {}, {}, {}).lag == 0


# -- heartbeats ----------------------------------------------------------------------------------


def test_rate_window_covers_the_recent_window_only() -> None:
    window = RateWindow(window_s=10)
    assert window.add(0, {"n": 0}) == ({"n": 0.0}, 0.0)
    rates, span = window.add(5, {"n": 50})
    assert rates == {"n": 10.0} and span == 5
    window.add(10, {"n": 100})
    rates, span = window.add(20, {"n": 120})  # the burst before t=10 has left the window
    assert span == 10 and rates == {"n": 2.0}


def test_heartbeat_round_trip_and_liveness() -> None:
    original = beat(counters={"completed": 3}, rates={"completed": 0.5}, age=2)
    decoded = Heartbeat.decode(original.encode())
    assert decoded == original
    assert decoded.live(NOW)
    assert not beat(age=3 * 5 + 6).live(NOW)
    with pytest.raises(ValueError):
        Heartbeat.decode(b'{"v": 99}')


def test_servers_sum_their_live_workers() -> None:
    rows = server_rows(
        [
            beat(
                worker="a",
                counters={"requests": 110, "completed": 100, "dead_letters": 2},
                gauges={"in_flight": 16, "paused": 0},
                rates={"requests": 4, "completed": 3, "errors": 1, "output_tokens": 900},
                errors={"http_503": 10},
                url="http://h1:9100/metrics",
            ),
            beat(
                worker="b",
                counters={"requests": 50, "completed": 40},
                gauges={"in_flight": 8, "paused": 1},
                rates={"requests": 6, "completed": 5, "errors": 0, "output_tokens": 100},
                errors={"http_503": 1, "timeout": 2},
            ),
            beat(label="http://gpu-02:30000", worker="c", rates={"completed": 1}),
            beat(role="tokenize", label="ds", worker="t"),
        ],
        NOW,
    )
    assert [r.server for r in rows] == ["http://gpu-01:30000", "http://gpu-02:30000"]
    first = rows[0]
    assert (first.workers, first.in_flight, first.paused, first.stale) == (2, 24, True, False)
    assert first.requests_per_s == 10 and first.output_tokens_per_s == 1000
    assert first.error_rate == pytest.approx(0.1)
    assert (first.requests, first.completed, first.dead_letters) == (160, 140, 2)
    assert first.errors == {"http_503": 11, "timeout": 2}
    assert first.metrics_urls == ["http://h1:9100/metrics"]
    assert rows[1].error_rate is None  # nothing sent recently
    assert finish_rate(rows) == 3 + 5 + 1


def test_a_server_paused_for_its_api_key_says_so() -> None:
    auth = {"in_flight": 8, "paused": 1, "paused_auth": 1}
    rows = server_rows(
        [
            beat(label="http://a:1", gauges=auth),
            beat(label="http://b:1", gauges={"paused": 1, "paused_auth": 0}),
            beat(label="http://c:1", gauges={"paused": 0}),
        ],
        NOW,
    )
    assert [(r.paused, r.paused_for) for r in rows] == [
        (True, "auth"),
        (True, "down"),
        (False, None),
    ]
    text = render_text(dataclasses.replace(snapshot(), servers=rows))
    assert "yes (auth)" in text and "yes (down)" in text
    assert (
        to_json(dataclasses.replace(snapshot(), servers=rows))["servers"]["http://a:1"][
            "paused_for"
        ]
        == "auth"
    )


def test_a_stale_worker_shows_its_last_counters_but_no_rates() -> None:
    rows = server_rows(
        [beat(age=60, counters={"completed": 7}, rates={"completed": 9}, gauges={"in_flight": 3})],
        NOW,
    )
    assert len(rows) == 1 and rows[0].stale and rows[0].workers == 0
    assert rows[0].completed == 7 and rows[0].completed_per_s == 0 and rows[0].in_flight == 0
    assert finish_rate(rows) is None  # so the ETA falls back to offsets
    assert server_rows([beat(age=FORGET_AFTER_S + 1)], NOW) == []


def test_a_restarted_worker_replaces_its_stale_predecessor() -> None:
    rows = server_rows(
        [
            beat(worker="old", age=100, counters={"completed": 50}),
            beat(worker="new", age=1, counters={"completed": 5}, rates={"completed": 2}),
        ],
        NOW,
    )
    assert (rows[0].workers, rows[0].completed, rows[0].completed_per_s) == (1, 5, 2)


def test_tokenizer_rows() -> None:
    rows = tokenizer_rows(
        [
            beat(
                role="tokenize",
                label="k26-v1",
                counters={"samples": 10, "tokens": 5000, "dead_letters": 1},
                rates={"samples": 2.5, "tokens": 1250},
            )
        ],
        NOW,
    )
    assert len(rows) == 1
    assert (rows[0].dataset, rows[0].samples, rows[0].tokens_per_s) == ("k26-v1", 10, 1250)


def test_status_reads_the_figures_the_stats_declare() -> None:
    """Heartbeats built from real stats readings (as workers send them): status finds each
    figure through its declaration, whatever its heartbeat key is."""
    generate = GenerateStats(in_flight=3, requests=9, completed=7, dead_letters=1, output_tokens=80)
    generate.paused, generate.paused_for, generate.exact_ids = True, "auth", "exact via x (y)"
    generate.errors.update({"http_503": 2})
    tokenize = TokenizeStats(samples=5, tokens=900, dead_letters=2)
    tokenize.sink.duplicates = 4

    def sent(stats: Figures, role: str, label: str) -> Heartbeat:
        heartbeat = new_heartbeat(role, label, 5.0, None)
        window = RateWindow(30.0)
        window.add(time.monotonic() - 10, {})  # ten seconds ago: nothing yet
        refresh(heartbeat, window, stats.counters, stats.gauges, stats.errors, stats.notes)
        return heartbeat

    now = time.time()
    (server,) = server_rows([sent(generate_figures(generate), "generate", "http://s:1")], now)
    assert (server.in_flight, server.requests, server.completed) == (3, 9, 7)
    assert (server.dead_letters, server.output_tokens, server.errors) == (1, 80, {"http_503": 2})
    assert (server.paused, server.paused_for, server.exact_ids) == (True, "auth", "exact via x (y)")
    assert server.completed_per_s == pytest.approx(0.7, rel=0.05)
    assert server.error_rate == pytest.approx(2 / 9, rel=0.05)
    (dataset,) = tokenizer_rows([sent(read_figures(tokenize), "tokenize", "ds")], now)
    assert (dataset.samples, dataset.tokens, dataset.duplicates, dataset.dead_letters) == (
        5,
        900,
        4,
        2,
    )


# -- rendering -----------------------------------------------------------------------------------


CAUSE = "turn: server '\\n' vs rendered '\\n\\n'"


def snapshot() -> StatusSnapshot:
    return StatusSnapshot(
        time=NOW,
        bootstrap="kafka:9092",
        topic_prefix="p-",
        published=1234,
        completions=1000,
        out="s3://bucket/out",
        datasets=[
            DatasetRow(
                "k26-v1", 990, 1_234_567, 654_321, 12, 0, 900, 3, {CAUSE: 3}, {"sglang-0.5.23": 990}
            )
        ],
        dead_letters={("generate", "context_too_long"): 8, ("tokenize", "bad_tool_call"): 2},
        groups=[group_lag("p-draftgen-generate", "prompts", {0: 1000}, {0: 0}, {0: 1234})],
        servers=server_rows(
            [beat(gauges={"in_flight": 16}, rates={"requests": 2, "completed": 2}, age=2)], NOW
        ),
        eta=estimate(234, 2.0),
    )


def test_table_aligns_numbers_right_and_words_left() -> None:
    lines = table(["server", "req/s", "topic"], [["a", "1.5", "prompts"], ["bbbb", "10.25", "c"]])
    assert lines == [
        "  server  req/s  topic",
        "  a         1.5  prompts",
        "  bbbb    10.25  c",
    ]


def test_text_has_every_section_aligned() -> None:
    text = render_text(snapshot())
    assert "prompts published   1,234  records written" in text
    assert "ETA                1m 57s  at 2.00 prompts/s" in text
    for expected in (
        "datasets in s3://bucket/out",
        "dead letters  10",
        "context_too_long",
        "p-draftgen-generate",
        "http://gpu-01:30000",
        "1,234,567",
        "rendered as",
        "sglang-0.5.23",
    ):
        assert expected in text
    lines = text.splitlines()
    header = next(line for line in lines if line.strip().startswith("dataset "))
    row = next(line for line in lines if "k26-v1" in line)
    assert len(header) == len(row)  # right-aligned numbers end where their header ends


def test_text_without_anything_yet() -> None:
    empty = StatusSnapshot(time=NOW, bootstrap="b", topic_prefix="", published=0, completions=0)
    text = render_text(empty)
    assert "no consumer groups yet" in text and "no generate worker heartbeats" in text
    assert "ETA" in text and "unknown" in text


def test_json_shape() -> None:
    data = to_json(snapshot())
    assert data["prompts"]["published"] == 1234 and data["completions"] == 1000
    assert data["datasets"]["k26-v1"]["tokens"] == 1_234_567
    assert data["datasets"]["k26-v1"]["drift_causes"] == {CAUSE: 3}
    assert data["datasets"]["k26-v1"]["normalizations"] == {"sglang-0.5.23": 990}
    assert data["dead_letters"] == {
        "total": 10,
        "by_stage": {"generate": {"context_too_long": 8}, "tokenize": {"bad_tool_call": 2}},
    }
    assert data["groups"]["p-draftgen-generate"] == {
        "topic": "prompts",
        "committed": 1000,
        "end": 1234,
        "lag": 234,
        "sealed": False,
    }
    assert data["servers"]["http://gpu-01:30000"]["in_flight"] == 16
    assert data["eta"]["seconds"] == 117.0


# -- command line --------------------------------------------------------------------------------


def status(*argv: str) -> StatusSettings:
    return build(StatusSettings, build_parser().parse_args(["status", *argv]))


def test_status_flags() -> None:
    settings = status("--bootstrap", "k:9092", "--watch")
    assert settings.watch_s == 5.0 and not settings.as_json and settings.datasets == []
    settings = status(
        *("--bootstrap", "k:9092", "--watch", "2", "--json", "--out", "o"),
        *("--dataset", "a", "--dataset", "b", "--dataset", "a"),
    )
    assert (settings.watch_s, settings.as_json, settings.datasets) == (2.0, True, ["a", "b"])
    assert settings.kafka.bootstrap == "k:9092"


def test_dataset_without_out_is_a_user_error() -> None:
    with pytest.raises(CliError, match="--dataset needs --out"):
        status("--bootstrap", "k:9092", "--dataset", "a")
    with pytest.raises(SystemExit):  # argparse's one line: "--watch: '0': input should be …"
        status("--bootstrap", "k:9092", "--watch", "0")


def test_worker_metrics_flags() -> None:
    args = build_parser().parse_args(
        ["worker", "generate", "--server", "http://s", "--bootstrap", "k:1", "--metrics-port", "0"]
    )
    observe = build(ObserveSettings, args)
    assert (observe.metrics_port, observe.metrics_host, observe.heartbeat_s) == (
        0,
        "127.0.0.1",
        5.0,
    )
    default = build_parser().parse_args(
        ["worker", "generate", "--server", "http://s", "--bootstrap", "k:1"]
    )
    assert build(ObserveSettings, default).metrics_port is None


def test_heartbeat_reader_keeps_the_latest_per_worker_and_honours_tombstones() -> None:
    reader = HeartbeatReader(KafkaSettings(bootstrap="k:9092"))
    reader._apply(b"w1", beat(worker="w1", counters={"completed": 1}).encode())
    reader._apply(b"w1", beat(worker="w1", counters={"completed": 2}).encode())
    reader._apply(b"w2", beat(worker="w2").encode())
    reader._apply(b"w3", b"not json at all")  # a foreign record is skipped, not fatal
    assert reader.latest["w1"].counters == {"completed": 2} and set(reader.latest) == {"w1", "w2"}
    reader._apply(b"w2", None)  # graceful stop
    assert set(reader.latest) == {"w1"}


def test_worker_stats_topic_is_compacted_with_one_partition() -> None:
    kafka = KafkaSettings(bootstrap="k:9092", partitions=64)
    assert topic_configs(kafka)[WORKER_STATS]["cleanup.policy"] == "compact"
    assert _PARTITIONS[WORKER_STATS] == 1


def test_dataset_rows_carry_the_drift_causes(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v1")
    rows = [SampleRow(p, "s", [1, 2], [0, 1], "stop", "server", drift=False) for p in "abc"]
    rows[0].drift, rows[0].drift_cause = True, CAUSE
    store.write_shard(0, 0, 2, rows)
    settings = StatusSettings(
        kafka=KafkaSettings(bootstrap="b:1"), out=str(tmp_path), datasets=["v1"]
    )
    [row] = StatusProbe(settings)._datasets()  # the markers only, no broker
    assert (row.compared, row.drifted, row.drift_causes) == (3, 1, {CAUSE: 1})


def test_a_versions_tokenize_group_is_the_one_its_manifest_names(tmp_path: Path) -> None:
    ShardStore(str(tmp_path), "v1").write_manifest({"consumer_group": "draftgen-tokenize-v1-ab12"})
    settings = StatusSettings(
        kafka=KafkaSettings(bootstrap="b:1"), out=str(tmp_path), datasets=["v1", "v2"]
    )
    probe = StatusProbe(settings)  # no broker: only the manifests are read
    assert probe._dataset_group("v1") == "draftgen-tokenize-v1-ab12"  # `run` made its own group
    assert probe._dataset_group("v2") == "draftgen-tokenize-v2"  # no manifest: named after it


def test_a_sealed_versions_group_shows_no_lag_and_comes_after_the_live_ones() -> None:
    old = group_lag("p-draftgen-tokenize-v1", "completions", {0: 540}, {0: 0}, {0: 1000})
    live = group_lag("p-draftgen-tokenize-v2", "completions", {0: 990}, {0: 0}, {0: 1000})
    shown = dataclasses.replace(
        snapshot(), groups=[dataclasses.replace(old, sealed=True), live, *snapshot().groups]
    )
    lines = render_text(shown).splitlines()
    rows = lines[lines.index("consumer lag") + 2 :][:3]
    assert [row.split()[0] for row in rows] == [
        "p-draftgen-tokenize-v2",
        "p-draftgen-generate",
        "p-draftgen-tokenize-v1",
    ]
    assert rows[0].split()[-1] == "10" and rows[2].split()[-1] == "sealed"
    groups = to_json(shown)["groups"]
    assert groups["p-draftgen-tokenize-v1"]["lag"] is None
    assert groups["p-draftgen-tokenize-v1"]["sealed"] is True
    assert groups["p-draftgen-tokenize-v2"]["lag"] == 10
