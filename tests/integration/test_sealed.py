"""Sealed means sealed: `seal` started right after a replay waits for the version to exist;
after the seal, the replay's worker refuses to change the version (one line, non-zero exit)
when new completions reach it; status, the store and the reader all say what the manifest
says; a tokenize worker started on the sealed version refuses at start."""

from __future__ import annotations

import os
import subprocess

import pytest

from compose.stack import draftgen_argv
from sinks.reader import DatasetReader, open_dataset
from streams.tools.progress import dataset_figures
from tests.polling import wait_for

pytestmark = pytest.mark.integration


def test_a_sealed_version_stays_sealed(pipeline, write_prompts) -> None:
    url, _ = pipeline.emulator()
    generate = pipeline.generate(url)
    expected = set(pipeline.publish(write_prompts(20)).prompt_ids)
    pipeline.wait(expected, [generate, pipeline.tokenize()])

    replay = pipeline.replay("v2")
    env = {**os.environ, **pipeline.env}
    # at once: the replay has not written its dataset.json yet (it loads its tokenizer first)
    assert pipeline.store("v2").manifest() is None
    seal = ["seal", "--out", pipeline.out, "--dataset", "v2", "--timeout", "180"]
    sealed = subprocess.run(
        draftgen_argv(*seal, *pipeline.common), env=env, capture_output=True, text=True, timeout=240
    )
    assert sealed.returncode == 0, sealed.stderr
    assert "sealed v2: 20 samples" in sealed.stdout

    # new completions reach the replay's worker after the seal: it stops, saying why
    more = set(pipeline.publish(write_prompts(5, name="more.jsonl", start=100)).prompt_ids)
    wait_for(lambda: not replay.alive(), 120, "the replay worker to stop on the sealed version")
    assert replay.popen is not None and replay.popen.returncode == 1
    log = replay.log_path.read_text()
    assert log.count("dataset version v2 is sealed: this worker stops") == 1

    store = pipeline.store("v2")
    manifest = store.sealed()
    assert manifest is not None and manifest.samples == 20
    figures = dataset_figures(store)  # what `status` shows
    table = DatasetReader(store).table()
    reader = open_dataset(f"{pipeline.out}/v2", pipeline.s3.endpoint.storage_options()).table()
    assert figures.samples == table.num_rows == reader.num_rows == manifest.samples
    assert set(table["prompt_id"].to_pylist()) == expected
    # nothing of the later prompts was left in the version's storage either
    assert not {pid for m in store.markers() for pid in m.prompt_ids} & more

    # a tokenize worker started on the sealed version refuses at once, in one line
    refused = subprocess.run(
        draftgen_argv(
            "worker",
            "tokenize",
            "--tokenizer-dir",
            str(pipeline.tokenizer_dir),
            "--out",
            pipeline.out,
            "--dataset",
            "v2",
            *pipeline.common,
        ),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "draftgen worker: error: dataset version v2 is sealed: a worker must not change it; "
        "`draftgen replay --dataset NEW` builds a new version from the completions"
    ]
