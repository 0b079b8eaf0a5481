"""`draftgen status` and the workers' /metrics on the real stack: after a small run with some
failures, every figure equals the true count (topics, shards, dead letters, offsets)."""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from typing import Any

import orjson
import pytest

from compose.stack import draftgen_argv
from sinks.reader import DatasetReader
from tests.integration.probes import scrape
from tests.polling import wait_for

pytestmark = pytest.mark.integration

PROMPTS = 40


def status(pipeline: Any, *flags: str) -> subprocess.CompletedProcess[str]:
    argv = draftgen_argv(
        "status", *pipeline.common, "--out", pipeline.out, "--dataset", pipeline.dataset, *flags
    )
    return subprocess.run(
        argv,
        env={**os.environ, **pipeline.env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def status_json(pipeline: Any) -> dict[str, Any]:
    return dict(orjson.loads(status(pipeline, "--json").stdout))


def settled(report: dict[str, Any], server: str, dataset: str, completed: int) -> bool:
    """Offsets committed and the last heartbeats sent: what `status` shows has stopped moving."""
    groups = report["groups"].values()
    tokenizer = report["tokenizers"].get(dataset, {})
    samples = report["datasets"].get(dataset, {}).get("samples")
    return (
        len(report["groups"]) == 2
        and all(g["lag"] == 0 for g in groups)
        and report["servers"].get(server, {}).get("completed") == completed
        and report["servers"][server]["in_flight"] == 0
        and tokenizer.get("samples") == samples
    )


def test_status_and_metrics_match_the_true_counts(pipeline, write_prompts) -> None:
    # Some prompts fail for good (400: context too long) and some requests are retried (503).
    url, _ = pipeline.emulator("--fail-400-rate", "0.1", "--fail-503-rate", "0.1", "--seed", "3")
    observe = ("--metrics-port", "0", "--heartbeat-interval", "1")
    generate = pipeline.generate(url, *observe)
    workers = [generate, pipeline.tokenize(*observe)]
    summary = pipeline.publish(write_prompts(PROMPTS))
    expected = set(summary.prompt_ids)
    pipeline.wait(expected, workers, timeout=240)

    # The true counts, read independently of `status`.
    completions = pipeline.completions()
    letters = pipeline.dead_letters()
    by_reason = Counter((letter.stage, letter.kind) for letter in letters)
    generate_dead = sum(n for (stage, _), n in by_reason.items() if stage == "generate")
    assert generate_dead > 0, "the emulator was asked to fail some prompts"
    table = DatasetReader(pipeline.store()).table()
    tokens = sum(table["num_tokens"].to_pylist())
    loss_tokens = sum(table["num_loss_tokens"].to_pylist())

    last: list[dict[str, Any]] = []

    def settled_report() -> dict[str, Any] | None:
        last[:] = [status_json(pipeline)]
        return last[0] if settled(last[0], url, pipeline.dataset, len(completions)) else None

    report = wait_for(
        settled_report, 60, lambda: f"status to settle; last report: {last}", interval=1
    )

    assert report["prompts"]["published"] == summary.published == PROMPTS
    assert report["completions"] == len(completions) == PROMPTS - generate_dead
    dataset = report["datasets"][pipeline.dataset]
    assert dataset["samples"] == table.num_rows == len(completions)
    assert (dataset["tokens"], dataset["loss_tokens"]) == (tokens, loss_tokens)
    assert dataset["duplicates"] == 0 and dataset["shards"] >= 1
    assert report["dead_letters"]["total"] == len(letters)
    assert {
        (stage, kind): n
        for stage, kinds in report["dead_letters"]["by_stage"].items()
        for kind, n in kinds.items()
    } == dict(by_reason)
    groups = report["groups"]
    prefix = pipeline.prefix
    assert groups[f"{prefix}draftgen-generate"] == {
        "topic": "prompts",
        "committed": PROMPTS,
        "end": PROMPTS,
        "lag": 0,
        "sealed": False,
    }
    assert groups[f"{prefix}draftgen-tokenize-{pipeline.dataset}"]["lag"] == 0
    assert report["eta"]["remaining"] == 0 and report["eta"]["seconds"] == 0

    server = report["servers"][url]
    assert (server["workers"], server["stale"], server["paused"]) == (1, False, False)
    assert server["completed"] == len(completions)
    assert server["dead_letters"] == generate_dead
    assert (
        server["errors"].get("context_too_long", 0) == by_reason[("generate", "context_too_long")]
    )
    assert server["requests"] == server["completed"] + sum(server["errors"].values())
    assert server["output_tokens"] == sum(
        int(c.usage.get("completion_tokens") or 0) for c in completions.values()
    )
    tokenizer = report["tokenizers"][pipeline.dataset]
    assert (tokenizer["samples"], tokenizer["tokens"]) == (table.num_rows, tokens)

    # The workers' /metrics serve the same counters.
    (generate_url,) = server["metrics_urls"]
    found = scrape(generate_url)
    label = frozenset({("server", url)})
    assert found[("draftgen_generate_completed_total", label)] == len(completions)
    assert found[("draftgen_generate_dead_letters_total", label)] == generate_dead
    assert found[("draftgen_generate_requests_total", label)] == server["requests"]
    assert found[("draftgen_generate_output_tokens_total", label)] == server["output_tokens"]
    assert found[("draftgen_generate_in_flight", label)] == 0
    assert found[("draftgen_generate_request_duration_seconds_count", label)] == len(completions)
    for kind, n in server["errors"].items():
        assert found[("draftgen_generate_errors_total", label | {("kind", kind)})] == n
    (tokenize_url,) = tokenizer["metrics_urls"]
    found = scrape(tokenize_url)
    label = frozenset({("dataset", pipeline.dataset)})
    assert found[("draftgen_tokenize_samples_total", label)] == table.num_rows
    assert found[("draftgen_tokenize_tokens_total", label)] == tokens
    assert found[("draftgen_tokenize_loss_tokens_total", label)] == loss_tokens
    assert found[("draftgen_tokenize_shards_total", label)] == dataset["shards"]

    # The text form renders the same run; a worker stopped on purpose leaves no stale row.
    text = status(pipeline).stdout
    assert re.search(rf"^prompts published +{PROMPTS} ", text, re.MULTILINE) and url in text
    generate.stop()
    assert url not in status_json(pipeline)["servers"]
