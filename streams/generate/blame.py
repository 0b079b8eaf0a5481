"""Who pays when a request fails for good: the prompt, or the server it ran on.

One server alone cannot tell a bad prompt from a bad server: a node serving under a wrong model
name answers 404 to everything while its health checks pass, one with a smaller context length
refuses long prompts only, and a prompt that trips a kernel assertion takes down any server it
runs on. So a failure is the prompt's only once another server agrees; until then it is a
`Failure` in the ledger (carried by the work's claim records, streams/core/ledger.py) and the
prompt goes back for another server. The rules, applied by the worker that holds the claim:

1. A permanent refusal (a 4xx other than the credentials', `context_too_long`, a 5xx after every
   attempt) is the prompt's when REFUSERS servers refused it, or when no other worker has
   claimed anything for `lone_s` and the consumer group has no other member (a fleet of one:
   nobody else to ask; `Peers`).
2. A crash (the server went down or stopped answering while the prompt ran on it) is a Failure
   of every prompt running there. A prompt that was running at CRASHES crashes of at least two
   servers, or at LONE_CRASHES of one, is the dead letter `server_crash` naming them; the other
   prompts run again.
   A server where a prompt failed (refused or crashed) does not take it again while other
   workers work (`failed_here`): the second opinion comes from another server.
3. A prompt that was running at a crash is a suspect: a worker runs one suspect at a time
   (OnceStage), so a second crash it causes finds no other suspect beside it, and each innocent
   prompt is run again at most once per crash it witnessed.
4. A server whose requests all fail for good closes its gate ("refusing"), dead-letters nothing
   while closed, and after a pause is on probation: one request at a time until one answers
   (`RefusalWatch`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

from streams.core.ledger import CRASH, Failure
from streams.generate.ports import Ledger

REFUSERS = 2  # distinct servers whose refusal makes it the prompt's
CRASHES = 2  # crashes (of at least two servers) a prompt may be running at before its letter
LONE_CRASHES = 3  # crashes of one server alone, for a fleet of one
SERVER_CRASH = "server_crash"  # the dead letter's kind
# requests in a row that a server refuses for good before its gate closes as "refusing"
REFUSING_AFTER = 5


def failed_here(failures: Sequence[Failure], server: str) -> bool:
    """Whether the work failed on `server` before (refused, or running at a crash): it is for
    another server now."""
    return any(f.server == server for f in failures)


def suspect(failures: Sequence[Failure]) -> bool:
    """Whether the work was running when a server crashed: it may be what crashed it."""
    return any(f.kind == CRASH for f in failures)


def verdict(failures: Sequence[Failure], alone: bool) -> tuple[str, str] | None:
    """(kind, message) of the prompt's dead letter when the failures so far are its fault, else
    None: it goes back, for another server."""
    crashes = [f for f in failures if f.kind == CRASH]
    crashed = _servers(crashes)
    if crashes and crashes[-1] is failures[-1]:
        if (len(crashes) >= CRASHES and len(crashed) >= 2) or len(crashes) >= LONE_CRASHES:
            message = (
                f"running when its server went down {len(crashes)} times "
                f"({', '.join(crashed)}): it crashes servers"
            )
            return SERVER_CRASH, message
        return None
    refusals = [f for f in failures if f.kind != CRASH]
    refusers = _servers(refusals)
    if not refusals or (len(refusers) < REFUSERS and not alone):
        return None
    last = refusals[-1]
    others = "" if len(refusers) > 1 else " (no other server took it)"
    return last.kind, f"refused by {len(refusers)} servers ({', '.join(refusers)}){others}"


def _servers(failures: Sequence[Failure]) -> list[str]:
    return sorted({f.server for f in failures})


# claim times without another worker's claim after which a worker is alone (rule 1): a worker
# with a free slot steals a free prompt long before
LONE_CLAIMS = 4


def alone(last_claim_elsewhere: float | None, lone_s: float, now: float | None = None) -> bool:
    """No other worker has claimed anything for `lone_s`: nobody else to ask."""
    now = time.time() if now is None else now
    return last_claim_elsewhere is None or now - last_claim_elsewhere > lone_s


class Peers:
    """Who else could take a prompt that failed on this worker's server: other workers' claims
    in the ledger, and, when the ledger shows none, the group (`group_size`, set by the app:
    workers started together may not have claimed anything yet)."""

    def __init__(self, ledger: Ledger, worker: str, server: str, claim_s: float):
        self.ledger = ledger
        self.worker = worker
        self.server = server
        self.lone_s = LONE_CLAIMS * claim_s
        self.group_size: Callable[[], Awaitable[int | None]] | None = None
        self._grouped = False  # the group had other workers when last asked

    def _quiet(self) -> bool:
        """No other worker's claim for `lone_s`."""
        last = self.ledger.last_claim_elsewhere(self.worker)
        return alone(last, self.lone_s, now=self.ledger.now())

    def alone(self) -> bool:
        return not self._grouped and self._quiet()

    async def alone_now(self) -> bool:
        """Alone by the ledger, and by the group when it can be asked."""
        if not self._quiet():
            return False
        if self.group_size is not None:
            try:
                self._grouped = (await self.group_size() or 1) > 1
            except Exception:  # not known: as the ledger says
                self._grouped = False
        return not self._grouped

    def for_another(self, failures: Sequence[Failure]) -> bool:
        """Failed on this server before, while another worker can take it."""
        return failed_here(failures, self.server) and not self.alone()


class RefusalWatch:
    """Counts a server's requests that failed for good in a row; at REFUSING_AFTER it calls
    `refusing(kind)` (the gate closes). From then on the server is on probation until a request
    answers: one request at a time, and one more refusal closes the gate again."""

    def __init__(self, refusing: Callable[[str], None]):
        self.refusing = refusing
        self.in_a_row = 0

    @property
    def on_probation(self) -> bool:
        return self.in_a_row >= REFUSING_AFTER - 1

    def answered(self) -> None:
        self.in_a_row = 0

    def refused(self, kind: str) -> None:
        self.in_a_row += 1
        if self.in_a_row >= REFUSING_AFTER:
            self.in_a_row = REFUSING_AFTER - 1  # reopened, it is tried with one request
            self.refusing(kind)


__all__ = [
    "CRASHES",
    "LONE_CLAIMS",
    "LONE_CRASHES",
    "REFUSERS",
    "REFUSING_AFTER",
    "SERVER_CRASH",
    "Peers",
    "RefusalWatch",
    "alone",
    "failed_here",
    "suspect",
    "verdict",
]
