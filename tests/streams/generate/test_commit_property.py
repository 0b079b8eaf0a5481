"""The stateful property test of a generate worker's in-flight and commit logic (issue: nothing
lost when consumers come and go).

Random interleavings of assign, revoke, deliver (also with a record lost on the way), end a
request (success, dead letter, transient failure), commit and crash, on the real workers of a
group of two over a model of faust's consumer (commit_model.py): a partition that moves between
them while its requests run is claimed by its old owner and waited for by its new one, and a
claim of a crashed worker lapses (`claim_s` short, so lapses while the claimant lives happen too).
The invariant, checked after every step: no committed offset has an offset below it, in its
partition, without an outcome (a completion or a dead letter in the topics).

Time is virtual (`VirtualTimeLoop`): when every task waits on a timer, the clock jumps to the
next one instead of sleeping, so a step costs CPU only (the same interleavings, no idle waits:
75 s of mostly sleeping before). A claimant that lives but renews late (a paused process) is a
rule of its own (`stall`), where before it happened only when the machine was slow.

Run against the code before leases (`streams/core/leases.py`), hypothesis found two
counterexamples (shrunk):
- with every rule: assign({0}); deliver_after_a_lost_record(0) (offset 1 first: 0 lost on the
  way); end it (success); commit — faust commits 2, past offset 0, never requested (5 s);
- without that rule (600 examples, 8 min): assign({0}); deliver_many(0, 4) (two slots: offsets 0
  and 1 run, the agent holds 2 waiting for a slot); assign({0}) (a rebalance gives the
  partition back; the window forgets 0 and 1); end offset 0 (success: a slot frees, and the
  agent adds the revoked offset 2 to the window, which no longer knows it is stale); end offset
  1's request (transient, retried), end offset 2 (success: acked, into faust's acked list,
  which faust keeps across the reassignment); commit — faust commits 3 (its gap check is off at
  a committed offset of 0), past offset 1, whose only request was still being retried under
  the ended assignment (its dead letter no longer ours to send).
"""

from __future__ import annotations

import asyncio
import selectors
from types import SimpleNamespace
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.streams.generate.commit_model import (
    LEDGER_PARTITIONS,
    OUTCOMES,
    ConsumerModel,
    settle,
)

PARTITIONS = 2
RECORDS = 6
CONCURRENCY = 2
MEMBERS = 2
# a claim lapses when time passes or the processes stall, as a killed (or paused) claimant's does
CLAIM_S = 0.05


class _JumpSelector(selectors.DefaultSelector):
    """Polls without blocking; a wait for a timer moves the loop's clock to it instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self.loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready or timeout is None:  # no timer: blocks as a real loop would
            return ready or super().select(timeout)
        self.loop.now += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on a clock of its own, which moves only when every task waits on a timer.
    The claims' wall clock (`time.time()` in streams/core/ledger.py and streams/generate/
    once.py) reads it too (`wall_clock`), so a claim lapses when the loop's timers say."""

    EPOCH = 1.7e9

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_JumpSelector(self))

    def time(self) -> float:
        return self.now

    def wall_clock(self) -> Any:
        return SimpleNamespace(time=lambda: self.EPOCH + self.now)


class CommitMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = VirtualTimeLoop()
        self.clocks = [
            mock.patch(f"{module}.time", self.loop.wall_clock())
            for module in (
                "streams.core.ledger",  # the claims' clock too (LedgerState.now)
                "tests.streams.generate.commit_model",
            )
        ]
        for clock in self.clocks:
            clock.start()
        try:
            self.model = ConsumerModel(
                PARTITIONS, RECORDS, CONCURRENCY, members=MEMBERS, claim_s=CLAIM_S, lagging=True
            )
            self._run(self.model.start_all())
        except BaseException:  # no teardown for a machine not built: the clocks back now
            self._restore()
            raise

    def _run(self, step: object) -> None:
        async def then_settle() -> None:
            if step is not None:
                await step  # type: ignore[misc]
            await settle()

        self.loop.run_until_complete(then_settle())

    @rule(
        owners=st.lists(
            st.one_of(st.none(), st.integers(0, MEMBERS - 1)),
            min_size=PARTITIONS,
            max_size=PARTITIONS,
        )
    )
    def assign(self, owners: list[int | None]) -> None:
        self._run(self.model.revoke())  # eager rebalance: all revoked, then the new assignment
        for member in range(MEMBERS):
            self.model.assign([p for p, owner in enumerate(owners) if owner == member], member)
        self._run(None)

    @rule(partition=st.integers(0, PARTITIONS - 1), count=st.integers(1, RECORDS))
    def hand_over(self, partition: int, count: int) -> None:
        """A rebalance moves the partition to the other member while its requests run; the
        new owner is handed its uncommitted offsets again (claimed, most of them)."""
        owners = {p: part.owner for p, part in self.model.partitions.items()}
        old = owners[partition]
        owners[partition] = 0 if old is None else (old + 1) % MEMBERS
        self._run(self.model.revoke())
        for member in range(MEMBERS):
            self.model.assign([p for p, owner in owners.items() if owner == member], member)
        for _ in range(count):
            self.model.deliver(partition)
        self._run(None)

    @rule()
    def revoke(self) -> None:
        self._run(self.model.revoke())

    @rule(partition=st.integers(0, PARTITIONS - 1))
    def deliver(self, partition: int) -> None:
        self.model.deliver(partition)
        self._run(None)

    @rule(partition=st.integers(0, PARTITIONS - 1), count=st.integers(2, RECORDS))
    def deliver_many(self, partition: int, count: int) -> None:
        for _ in range(count):
            self.model.deliver(partition)
        self._run(None)

    @rule(partition=st.integers(0, PARTITIONS - 1))
    def deliver_after_a_lost_record(self, partition: int) -> None:
        self.model.deliver(partition, skip=1)
        self._run(None)

    @precondition(lambda self: bool(self.model.pending()))
    @rule(index=st.integers(0, 7), outcome=st.sampled_from(OUTCOMES))
    def end_request(self, index: int, outcome: str) -> None:
        self.model.end(index, outcome)
        self._run(None)

    @rule()
    def time_passes(self) -> None:
        """Long enough for a claim to lapse unless renewed (a crashed claimant's)."""
        self._run(asyncio.sleep(CLAIM_S * 1.5))

    @rule()
    def stall(self) -> None:
        """The processes pause (a loaded machine, a long GC) past a claim's lapse: every timer
        is late, the claimants' renewals too, and then they all run."""
        self.loop.now += CLAIM_S * 1.5
        self._run(None)

    @rule(
        member=st.integers(0, MEMBERS - 1),
        partition=st.integers(0, LEDGER_PARTITIONS - 1),
        count=st.integers(1, 4),
    )
    def read_ledger(self, member: int, partition: int, count: int) -> None:
        """One member's reader gets further in one partition of the ledger: readers lag, and
        a prompt's claim and outcome keys reach each reader in any order."""
        self.model.read_ledger(member, partition, count)
        self._run(None)

    @rule()
    def read_whole_ledger(self) -> None:
        for member in range(MEMBERS):
            for partition in range(LEDGER_PARTITIONS):
                self.model.read_ledger(member, partition)
        self._run(None)

    @rule(
        member=st.integers(0, MEMBERS - 1),
        partition=st.integers(0, PARTITIONS - 1),
        offset=st.integers(0, RECORDS - 1),
    )
    def steal(self, member: int, partition: int, offset: int) -> None:
        """A member takes a prompt from a backlog, whoever owns it (and whatever runs it)."""
        self._run(self.model.steal(member, partition, offset))

    @rule(member=st.integers(0, MEMBERS - 1))
    def server_down(self, member: int) -> None:
        self.model.server_down(member)
        self._run(None)

    @rule(member=st.integers(0, MEMBERS - 1))
    def server_up(self, member: int) -> None:
        self.model.server_up(member)
        self._run(None)

    @rule()
    def commit(self) -> None:
        self.model.commit()

    @rule(member=st.integers(0, MEMBERS - 1))
    def crash(self, member: int) -> None:
        self._run(self.model.crash(member))

    @invariant()
    def nothing_committed_without_an_outcome(self) -> None:
        missing = self.model.committed_without_outcome()
        assert not missing, f"committed past prompts without an outcome: {missing}"

    @invariant()
    def no_prompt_runs_twice(self) -> None:
        """No prompt is requested while another live request of it runs, except after a kill
        (the killed member's requests end with it here) or a lapsed claim; nor after a claim of
        it was released with its outcome."""
        assert not self.model.overlaps, f"GPU work done twice: {self.model.overlaps}"
        assert not self.model.redone, f"GPU work redone: {self.model.redone}"

    def teardown(self) -> None:
        try:
            self.loop.run_until_complete(self.model.close())
        finally:
            self._restore()

    def _restore(self) -> None:
        self.loop.close()
        for clock in self.clocks:
            clock.stop()


CommitMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCommitMachine = CommitMachine.TestCase
