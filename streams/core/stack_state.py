"""The local stack's state file: where `draftgen stack up` says its Kafka and S3 are, so that
`run`, the workers and the one-shot commands (`status`, `dead-letters`, `replay`, `seal`,
`report`, `export`) find them without flags.

One JSON file, `{stack dir}/stack.json` (mode 0600: it holds the stack's S3 secret, which is
never printed), written by the stack's supervisor once its services answer and removed when it
stops. A file whose supervisor is gone (killed with -9, a reboot) is ignored.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

STATE_FILE = "stack.json"
STATE_VERSION = 1


@dataclass(frozen=True)
class StackState:
    pid: int  # the supervisor: `stack down` stops it, and it stops its services
    bootstrap: str
    s3_endpoint_url: str
    s3_access_key: str
    s3_secret_key: str = field(repr=False)
    bucket: str
    workdir: str
    started_at: float = field(default_factory=time.time)
    v: int = STATE_VERSION

    @property
    def out(self) -> str:
        """An output root in the stack's bucket."""
        return f"s3://{self.bucket}/data"

    def holds(self, url: str) -> bool:
        """Whether `url` is in the stack's bucket."""
        for scheme in ("s3://", "s3a://"):
            if url.startswith(scheme):
                return url.removeprefix(scheme).split("/", 1)[0] == self.bucket
        return False

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2)

    @classmethod
    def decode(cls, raw: bytes) -> StackState:
        data = orjson.loads(raw)
        if not isinstance(data, dict) or data.get("v") != STATE_VERSION:
            raise ValueError("not a stack state file of this version")
        return cls(**data)

    def write(self, directory: Path) -> Path:
        """Atomically, readable by its owner only."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / STATE_FILE
        staging = path.with_suffix(".tmp")
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(self.encode())
        staging.replace(path)
        return path


def supervisor_alive(pid: int) -> bool:
    """Whether `pid` runs and is a stack supervisor (not a recycled pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: not our supervisor
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc: trust the pid
    return b"stack" in cmdline and b"serve" in cmdline


def read_state(directory: Path) -> StackState | None:
    """The state file in `directory`, whatever its supervisor's state; None if absent or
    unreadable."""
    try:
        return StackState.decode((directory / STATE_FILE).read_bytes())
    except (OSError, ValueError, TypeError):
        return None


def live_stack(directory: Path) -> StackState | None:
    """The running stack of `directory`, or None."""
    state = read_state(directory)
    return state if state is not None and supervisor_alive(state.pid) else None
