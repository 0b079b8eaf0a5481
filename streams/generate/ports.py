"""What the generate stage asks of its collaborators: each a Protocol, so that a unit test
passes a small fake and the app passes the real one (HttpServerClient, LedgerFollower, CrashGuard,
KafkaBacklogs)."""

from __future__ import annotations

import asyncio
from typing import Protocol

from streams.core.ledger import Claim, Failure
from streams.core.records import CompletionRecord, PromptRecord
from streams.core.serving import ServerNormalization
from streams.generate.exact_ids import IdsWay
from streams.generate.identity import ServerIdentity


class Named(Protocol):
    @property
    def name(self) -> str: ...


class ServerClient(Protocol):
    """One SGLang or vLLM server (streams/generate/client.py `HttpServerClient`)."""

    @property
    def base_url(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def family(self) -> Named: ...
    @property
    def server_version(self) -> str | None: ...

    # "sglang" or "vllm": which server reported the version
    @property
    def server_kind(self) -> str: ...

    async def discover(self) -> None: ...
    async def use_server_version(self) -> ServerNormalization: ...
    # what the server said it is (its revision, its tokenizer), once asked
    @property
    def identity(self) -> ServerIdentity: ...

    async def probe_ids(self) -> IdsWay | None: ...
    async def max_running_requests(self) -> int | None: ...
    async def unavailable(self) -> str | None:
        """None when healthy, else why not (client.DOWN: connections refused; client.SLOW: no
        answer in time, a busy server; client.AUTH)."""
        ...

    async def complete(self, prompt: PromptRecord) -> CompletionRecord: ...
    async def close(self) -> None: ...


class Ledger(Protocol):
    """What was generated, with which settings (streams/core/ledger.py's LedgerFollower)."""

    @property
    def caught_up(self) -> asyncio.Event: ...

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def contains(self, prompt_id: str, settings: str) -> bool: ...
    def ended(self, prompt_id: str, settings: str) -> bool: ...
    def add(self, prompt_id: str, settings: str) -> None: ...
    def add_dead(self, prompt_id: str, settings: str) -> None: ...

    # claims (streams/generate/claims.py): by work key
    def settled(self, work: str) -> bool: ...
    def holder(self, work: str) -> Claim | None:
        """The claim that holds the work by the ledger's rule (it may have lapsed)."""
        ...

    def expect(self, work: str, claim: Claim) -> asyncio.Future[bool]:
        """Before writing `claim`: resolves once it is read back, true if it won."""
        ...

    def forget(self, work: str, claim: Claim) -> None: ...
    def failures(self, work: str) -> tuple[Failure, ...]:
        """The work's failures without an outcome (streams/generate/blame.py), oldest first."""
        ...

    def last_claim_elsewhere(self, worker: str) -> float | None:
        """When (the broker's time) another worker last claimed anything."""
        ...

    def now(self) -> float:
        """The broker's time, as the ledger's records tell it: claims are judged on it."""
        ...

    def watch(self, work: str) -> asyncio.Event:
        """Set at the next record of the work read."""
        ...


class Gate(Protocol):
    """Whether requests may go to the server now (streams/generate/gate.py's ServerGate)."""

    @property
    def is_open(self) -> bool: ...

    async def wait_open(self) -> None: ...
    async def wait_closed(self) -> None:
        """Until the gate closes (the server went down, hung or refuses the key)."""
        ...

    async def pause(self, reason: str) -> None:
        """Close the gate for `reason` until the server is healthy again (probed by one task)."""
        ...

    def crashed(self) -> bool:
        """Whether the gate is closed because the server went down or stopped answering (not
        for its credentials): the requests it ended are each a crash (blame.py)."""
        ...

    def refusing(self, kind: str) -> None:
        """The server fails every request for good (`kind`): take no new requests for a
        while, then try one (blame.py, rule 4); running requests go on."""
        ...

    async def unavailable(self) -> str | None: ...


class PoisonCheck(Protocol):
    """streams/core/crash_guard.py's CrashGuard."""

    def poisoned(self, topic: str, partition: int, offset: int) -> str | None: ...


class Backlogs(Protocol):
    """Other workers' backlogs of the prompts topic, as a thief sees them
    (streams/generate/backlogs.py)."""

    async def committed(self) -> dict[int, int]:
        """Where each partition's backlog starts: the group's committed offset, or the log's
        start for a partition nothing was committed for (every partition of the topic)."""
        ...

    async def ends(self, partitions: list[int]) -> dict[int, int]: ...
    async def read(self, partition: int, offsets: set[int]) -> list[tuple[bytes, bytes]]:
        """(key, value) of the records at `offsets` (one compacted away is skipped)."""
        ...

    async def close(self) -> None: ...
