"""The console says what is wrong: `draftgen run --server URL` with the server down says so on
its own console (not only in a worker log), and `status` shows the server paused (down); when
the server comes up the console says so, with the way it returns exact token ids, and the run
ends; `dead-letters` lists failed prompts with their source ids."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from compose.process import free_port
from streams.cli.run import bundled_tokenizer_dir
from tests.polling import wait_for

pytestmark = pytest.mark.integration


def _status(pipeline) -> dict:
    done = pipeline.draftgen("status", "--json", *pipeline.common, timeout=120)
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout)


def test_run_says_on_its_console_that_its_server_is_down_and_when_it_is_back(
    pipeline, tmp_path: Path
) -> None:
    port = free_port()
    server = f"http://127.0.0.1:{port}"
    prompts = tmp_path / "mine.jsonl"
    rows = [{"id": f"q{i}", "messages": [{"role": "user", "content": f"Q {i}?"}]} for i in range(6)]
    # a row that cannot be a prompt: its id reaches `dead-letters`
    rows.append({"id": "q-bad", "messages": [{"role": "assistant", "content": "no question"}]})
    prompts.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    run = pipeline.stack.start_worker(
        "run",
        [
            "run",
            str(prompts),
            "--server",
            server,
            "--workdir",
            str(tmp_path / "run"),
            "--timeout",
            "400",
            *pipeline.common,
        ],
        env=pipeline.env,
    )
    console = run.log_path  # the run's own stdout and stderr, not a worker's log

    wait_for(
        lambda: f"server {server} is not answering" in console.read_text(),
        120,
        lambda: f"the console to say the server is down:\n{run.tail()}",
    )
    assert run.alive()
    row = wait_for(
        lambda: (found := _status(pipeline)["servers"].get(server)) and found["paused"] and found,
        60,
        "status to show the server paused",
    )
    assert row["paused_for"] == "down"

    pipeline.stack.start_worker(
        "late-server",
        ["emulate-server", "--tokenizer-dir", str(bundled_tokenizer_dir()), "--port", str(port)],
    )
    wait_for(lambda: not run.alive(), 300, lambda: f"the run to end:\n{run.tail()}")
    text = console.read_text()
    assert run.popen is not None and run.popen.returncode == 0, text
    assert f"server {server} is answering again" in text
    assert f"server {server}: token ids exact via" in text
    assert "done in" in text and "samples      6" in text

    listed = pipeline.draftgen("dead-letters", "--json", *pipeline.common, timeout=120)
    assert listed.returncode == 0, listed.stderr
    failed = orjson.loads(listed.stdout)["failed_prompts"]
    assert [(f["source_id"], f["stage"], f["kind"]) for f in failed] == [
        ("q-bad", "publish", "no_user_turn")
    ]
