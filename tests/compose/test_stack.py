"""A stack that stays up: `draftgen stack up`, then the main job on it, then the commands its
summary prints (report, export, status, dead-letters, replay, seal), run as printed against the
broker the run left up, then `stack down`; the supervisor is stopped by its PID. The main job
run again on it builds its dataset from the stored completions of its own prompts."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from pathlib import Path

import orjson
import pytest

from compose.process import ManagedProcess
from compose.stack import draftgen_argv
from sinks.reader import DatasetReader
from sinks.shards import ShardStore
from streams.core.records import CompletionRecord
from streams.core.settings import COMPLETIONS, KafkaSettings
from streams.core.stack_state import STATE_FILE, live_stack, read_state
from tests.integration.probes import send_raw
from tests.polling import wait_for

pytestmark = pytest.mark.integration

SAMPLE_PROMPTS = 41  # producers/samples/sample_prompts.jsonl


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # exited, not reaped yet by its parent (init)
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def test_the_main_job_leaves_a_stack_the_printed_commands_use(tmp_path: Path) -> None:
    home = tmp_path / "stack"
    env = {**os.environ, "DRAFTGEN_STACK_DIR": str(home)}
    for name in ("DRAFTGEN_BOOTSTRAP", "DRAFTGEN_S3_ENDPOINT_URL", "DRAFTGEN_S3_ACCESS_KEY"):
        env.pop(name, None)

    def draftgen(*args: str, timeout: float = 300) -> str:
        done = subprocess.run(
            draftgen_argv(*args), env=env, cwd=tmp_path, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    def printed(line: str, *changes: tuple[str, str]) -> str:
        """Run a command as the summary printed it (with a word or two changed)."""
        words = shlex.split(line.split(":", 1)[1].split("   (")[0])
        for old, new in changes:
            words[words.index(old)] = new
        done = subprocess.run(
            words, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, (words, done.stdout, done.stderr)
        return done.stdout

    up = draftgen("stack", "up")
    state = live_stack(home)
    assert state is not None and f"pid {state.pid}" in up and state.bootstrap in up
    assert state.s3_secret_key not in up  # the credentials stay in the state file
    assert (home / STATE_FILE).stat().st_mode & 0o077 == 0
    replay: ManagedProcess | None = None
    try:
        assert f"pid {state.pid}" in draftgen("stack", "up")  # once: a second up finds it
        run = draftgen("run", "--workdir", str(tmp_path / "run"), "--servers", "1")
        assert f"{SAMPLE_PROMPTS} generated now, 0 from before" in run
        lines = run.splitlines()
        assert "next:" in lines
        steps = {line.split(":", 1)[0].strip(): line for line in lines[lines.index("next:") + 1 :]}
        assert set(steps) >= {"look at the data", "export it", "where it stands", "failed prompts"}
        assert "--bootstrap" not in run  # the commands find the stack themselves
        samples = int(next(x for x in lines if x.strip().startswith("samples")).split()[-1])
        assert samples == SAMPLE_PROMPTS
        built = DatasetReader(ShardStore(str(tmp_path / "run" / "out"), "sample")).table()
        assert len(set(built["prompt_id"].to_pylist())) == SAMPLE_PROMPTS

        status = printed(steps["where it stands"])
        assert "datasets in" in status and f"{samples:,}" in status
        assert printed(steps["failed prompts"]).splitlines()[0].endswith("dead letters")
        printed(steps["look at the data"])
        report = orjson.loads((tmp_path / "report-sample" / "report.json").read_bytes())
        assert report["samples"] == samples
        # the broker is still there: the earlier stages' errors are recorded, not unknown
        assert isinstance(report["errors"]["upstream"]["by_kind"], dict)
        printed(steps["export it"])
        assert len((tmp_path / "sample.jsonl").read_text().splitlines()) == samples

        words = shlex.split(steps["rebuild (replay)"].split(":", 1)[1].split("   (")[0])
        replay = ManagedProcess("replay", words, tmp_path / "replay.log", env=env).start()
        out = words[words.index("--out") + 1]
        rebuilt = ShardStore(out, "sample-v2")
        wait_for(lambda: rebuilt.manifest() is not None, 180, "the replay to start sample-v2")
        sealed = printed(steps["seal the version"], ("sample", "sample-v2"))
        assert sealed.startswith(f"sealed sample-v2: {samples} samples"), sealed
        printed(steps["seal the version"])
        assert ShardStore(out, "sample").sealed() is not None
        replay.stop()

        # another source's completion in the topic: not a prompt of the next run
        stray = CompletionRecord(
            prompt_id="stray", messages=[{"role": "user", "content": "hi"}], content="hello"
        )
        send_raw(
            KafkaSettings(bootstrap=state.bootstrap), COMPLETIONS, [(b"stray", stray.encode())]
        )
        # the main job again (`compose/setup.sh run`: the same dataset name, its own output):
        # nothing to generate, every sample built from the stored completions
        again = draftgen("run", "--workdir", str(tmp_path / "again"), "--servers", "1")
        assert "published 0, " in again and f"already generated {SAMPLE_PROMPTS}," in again
        assert f"0 generated now, {SAMPLE_PROMPTS} from before" in again
        second = DatasetReader(ShardStore(str(tmp_path / "again" / "out"), "sample")).table()
        assert sorted(second["prompt_id"].to_pylist()) == sorted(built["prompt_id"].to_pylist())

        # `stack down` (as printed): SIGTERM to the supervisor by its PID; it stops its services
        assert f"was pid {state.pid}" in printed(steps["when done"])
        assert pid_gone(state.pid) and read_state(home) is None
        assert "no stack runs" in draftgen("stack", "down")
    finally:
        if replay is not None:
            replay.stop()
        if not pid_gone(state.pid):  # a failure above: stop it by its PID all the same
            os.kill(state.pid, signal.SIGTERM)
            wait_for(lambda: pid_gone(state.pid), 90, "the stack's supervisor to stop")
