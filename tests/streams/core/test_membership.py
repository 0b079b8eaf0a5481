"""The default static identity: stable across restarts, unique per live worker on a host."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from streams.core.membership import claim_slot, instance_id
from streams.core.settings.base import _SAFE_NAME

GROUP = "p-draftgen-generate"
URL = "http://10.0.0.7:30000"


def test_two_workers_on_one_server_get_different_ids(tmp_path: Path) -> None:
    first = claim_slot(tmp_path, GROUP, URL, host="node1")
    second = claim_slot(tmp_path, GROUP, URL, host="node1")
    try:
        assert (first.slot, second.slot) == (0, 1)
        assert first.instance_id == "node1-10.0.0.7_30000-0"
        assert second.instance_id == "node1-10.0.0.7_30000-1"
    finally:
        first.release()
        second.release()


def test_a_restart_takes_its_slot_again_and_other_servers_and_groups_do_not_share(
    tmp_path: Path,
) -> None:
    kept = claim_slot(tmp_path, GROUP, URL, host="node1")
    crashed = claim_slot(tmp_path, GROUP, URL, host="node1")
    other_server = claim_slot(tmp_path, GROUP, "http://10.0.0.8:30000", host="node1")
    other_group = claim_slot(tmp_path, "q-draftgen-generate", URL, host="node1")
    try:
        assert (other_server.slot, other_group.slot) == (0, 0)
        lost = crashed.instance_id
        crashed.release()  # its process ended
        restarted = claim_slot(tmp_path, GROUP, URL, host="node1")
        assert restarted.instance_id == lost
        restarted.release()
    finally:
        for claim in (kept, other_server, other_group):
            claim.release()


def test_a_killed_process_frees_its_slot(tmp_path: Path) -> None:
    """The lock lives with the process: kill -9 frees the slot, no stale lock to clean."""
    script = textwrap.dedent(
        f"""
        import sys, pathlib
        from streams.core.membership import claim_slot
        claim = claim_slot(pathlib.Path({str(tmp_path)!r}), {GROUP!r}, {URL!r}, host="node1")
        print(claim.slot, flush=True)
        sys.stdin.read()
        """
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "0"
        taken = claim_slot(tmp_path, GROUP, URL, host="node1")
        assert taken.slot == 1  # held by the other process
        taken.release()
    finally:
        holder.kill()
        holder.wait()
    again = claim_slot(tmp_path, GROUP, URL, host="node1")
    assert again.slot == 0
    again.release()


def test_ids_are_safe_names_within_100_characters() -> None:
    long_url = "https://" + "very-long-host-name." * 10 + "example:8443/v1/some/path?x=1"
    for host, url in [("node1", URL), ("h" * 90, long_url), ("ü-host", "http://[::1]:8000")]:
        for slot in (0, 7, 123):
            name = instance_id(host, url, slot)
            assert _SAFE_NAME.fullmatch(name), name
            assert name.endswith(f"-{slot}")
    # cut ones stay distinct by server
    assert instance_id("h" * 90, long_url, 0) != instance_id("h" * 90, long_url + "2", 0)
