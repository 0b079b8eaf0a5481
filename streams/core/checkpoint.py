"""The commit protocol in one place: what of a partition may be committed, and when.

The invariant, for both stages:

    an offset is committed only after its own outcome and every outcome below it are durable.

A record's way to a commit, in order (each step's code is named; this module is step 4):

1. Lease (streams/core/leases.py `Leases.admit`): the delivery is admitted by its partition's
   lease, in offset order from the group's committed offset (streams/core/group_starts.py),
   without a hole; one delivered under an earlier assignment is refused, unacked.
2. Outcome: the stage makes the record's outcome durable. generate: the completion (or dead
   letter) acknowledged by Kafka, then its outcome in the `generated` ledger
   (streams/generate/stage.py, intake.py). tokenize: the window's shard, then its commit marker
   (sinks/sink.py).
3. Ack: the outcome's offset is acked through its lease, in offset order (`Leases.acked`), so
   the lease's acked run grows only over durable outcomes.
4. Commit: faust's consumer thread asks to commit; `Checkpoint.offsets` lowers each partition
   to its lease's acked run and leaves out what a rebalance took. faust's own override is a
   thin adapter that calls it (streams/core/faust_app.py `_RebalanceSafeCommits`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any

from streams.core.leases import Leases

log = logging.getLogger(__name__)


class Checkpoint:
    """Step 4 for one app: the commit its partitions' leases allow. It runs in faust's consumer
    thread, so it only reads and never waits. Without leases (an app whose stage acks through
    faust alone) it only leaves out what a rebalance took."""

    def __init__(self, leases: Leases | None = None, logger: Any = log):
        self.leases = leases
        self.log = logger  # a logging.Logger, or faust's thread's CompositeLogger

    def offsets(self, wanted: Mapping[Any, int], assigned: Collection[Any]) -> dict[Any, int]:
        """What to commit of the offsets faust `wanted`; empty: nothing (faust then answers as
        for a commit the group refused)."""
        allowed: dict[Any, int] = {}  # by faust's TP
        for tp, offset in wanted.items():
            # 1. no further than the partition's lease's acked run; without a lease, or with
            #    nothing acked under it yet, not at all
            limit = offset if self.leases is None else self.leases.committable(tp, offset)
            if limit is None:
                continue
            # 2. a commit lowered here is a bug upstream (faust's gap filling passed an offset
            #    never acked: faust-streaming #606), caught before it reached Kafka
            if limit < offset:
                self.log.error(
                    "commit of %s/%s lowered from %d to %d: offsets from %d on have no "
                    "durable outcome yet (caught by the lease's commit guard)",
                    getattr(tp, "topic", tp),
                    getattr(tp, "partition", ""),
                    offset,
                    limit,
                    limit,
                )
            allowed[tp] = limit
        # 3. a rebalance that took every partition since faust checked them leaves nothing of
        #    ours: their new owners resume at the group's committed offsets
        if allowed and not any(tp in assigned for tp in allowed):
            self.log.info("commit of revoked partitions skipped after a rebalance: %r", allowed)
            return {}
        return allowed
