"""A worker's static group membership by default: an identity stable across restarts, unique
per worker.

With a static identity (Kafka's `group.instance.id`, KIP-345) a restarted worker takes its old
place in the group and gets its old partitions back at once, without a rebalance of the
others, as long as it is back within the session timeout. The identity must be the same after
a restart and different for every live worker: two live members with one identity fence each
other (the broker gives the place to the latest to join; the other's next request is refused:
FENCED_INSTANCE_ID, or an unknown member id, and it rejoins and takes the place back, and so
on), so neither keeps its partitions.

The default identity is `host-server-slot`: this host's name, the server the worker serves
and the first slot free on this host for that server and group. A slot is held by an exclusive
`flock` on a file in the state directory for the process's life: a second worker for the same
server on the same host finds slot 0 held and takes slot 1; a worker restarted after a crash
(kill -9 included: the kernel drops the lock with the process) finds its slot free again.
`--instance-id` names the identity instead (then keeping it unique is the operator's part).
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# a group instance id is also a settings SafeName: at most 100 characters
_MAX_ID = 100
# slots tried before giving up: more workers than this for one server on one host is a mistake
MAX_SLOTS = 256


def _slug(text: str) -> str:
    return _UNSAFE.sub("_", text).strip("._-")


def instance_id(host: str, server: str, slot: int) -> str:
    """The static identity of slot `slot` of `server` on `host`: readable, at most 100 of
    [A-Za-z0-9._-], starting with a letter or digit; cut with a digest when too long."""
    address = server.split("://", 1)[-1]
    name = f"{_slug(host) or 'host'}-{_slug(address) or 'server'}-{slot}"
    if len(name) <= _MAX_ID:
        return name
    digest = hashlib.sha256(f"{host}\0{server}".encode()).hexdigest()[:12]
    tail = f"-{digest}-{slot}"
    return name[: _MAX_ID - len(tail)].rstrip("._-") + tail


# claims are held until the process exits (the kernel drops the locks then, kill -9 included):
# not at shutdown, when the worker may still commit as the member of its slot
_HELD: list[SlotClaim] = []


@dataclass
class SlotClaim:
    """A claimed slot: held while this object (its open, locked file) lives."""

    slot: int
    instance_id: str
    path: Path
    _fd: int

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the file drops the lock
            self._fd = -1
        if self in _HELD:
            _HELD.remove(self)


def claim_slot(state_dir: Path, group: str, server: str, host: str | None = None) -> SlotClaim:
    """The first slot of (`group`, `server`) free on this host, locked for this process's life.
    Lock files stay in `state_dir/members` (empty; removing one could hand a slot to two)."""
    host = host or socket.gethostname()
    directory = state_dir / "members"
    directory.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(f"{group}\0{server}".encode()).hexdigest()[:16]
    for slot in itertools.count():
        if slot >= MAX_SLOTS:
            raise RuntimeError(f"{MAX_SLOTS} workers of group {group} already serve {server} here")
        path = directory / f"{_slug(group)[:60]}-{key}.{slot}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        claim = SlotClaim(slot, instance_id(host, server, slot), path, fd)
        _HELD.append(claim)
        return claim
    raise AssertionError("unreachable")
