"""`draftgen worker generate`: the Faust app around GenerateWorker, bound to one SGLang server.
Wiring only: the parts are streams/generate/{worker,stage,once,claims,intake,slots,gate,steal,
fair}.py."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import Any

import faust

from streams.core.crash_guard import CrashGuard, default_state_dir
from streams.core.faust_app import consume, create_app, guard_commits, kafka_sender, raw_topic
from streams.core.group_starts import GroupStarts
from streams.core.ledger import LedgerFollower
from streams.core.membership import claim_slot
from streams.core.settings import (
    COMPLETIONS,
    DEAD_LETTERS,
    GENERATE_GROUP,
    GENERATED,
    PROMPTS,
    GenerateSettings,
    ObserveSettings,
    OnceSettings,
    generate_prefetch,
)
from streams.generate.backlogs import KafkaBacklogs
from streams.generate.fair import FairTurns
from streams.generate.stats import GenerateStats, generate_figures
from streams.generate.steal import Stealer
from streams.generate.timed import TimedClient
from streams.generate.worker import GenerateWorker, generate_backoff
from streams.observe.app import install
from streams.observe.figures import declared
from streams.observe.metrics import GenerateMetrics

log = logging.getLogger(__name__)


def observe_generate(
    app: faust.App, worker: GenerateWorker, metrics: GenerateMetrics, settings: ObserveSettings
) -> str | None:
    metrics.attach(lambda: generate_figures(worker.stats, unreachable=worker.server.down))
    return install(app, worker.settings.kafka, metrics, settings, worker.broker)


def member_id(settings: GenerateSettings, observe: ObserveSettings, group: str) -> str | None:
    """The worker's static identity in its group (streams/core/membership.py): --instance-id,
    else this host's slot for the server (held until the process exits); None: dynamic."""
    if settings.instance_id is not None:
        log.info("static member %s of group %s (--instance-id)", settings.instance_id, group)
        return settings.instance_id
    if not settings.static_membership:
        return None
    state_dir = Path(observe.state_dir) if observe.state_dir else default_state_dir()
    claim = claim_slot(state_dir, group, settings.server)
    log.info(
        "static member %s of group %s (slot %d of this host for %s)",
        claim.instance_id,
        group,
        claim.slot,
        settings.server,
    )
    return claim.instance_id


async def drain(
    app: faust.App, worker: GenerateWorker, seconds: float, stealer: Stealer | None = None
) -> None:
    """SIGTERM: steal no more, commit what is acked, drop the prompts not requesting and stop
    the consumer (a dynamic member leaves the group and its partitions move now; a static one,
    the default, keeps them until its session times out; either way their new owners wait for
    the claims of the requests running here), then finish those for up to `seconds` (the
    stolen ones too; a server that is down or hung ends them at once) and release the rest."""
    if stealer is not None:
        stealer.stop()  # else it takes prompts it would leave unfinished when it exits
    if worker.once is not None:
        worker.once.draining = True  # stolen prompts not requesting stop
    await app.consumer.commit()  # under the leases, which the revocation below ends
    await worker.revoke_partitions(worker.intake.leases.held())
    await app.consumer.stop()  # faust's own stop of it later does nothing
    await worker.finish_requests(seconds)


def stop_refused() -> None:
    """The server serves another model than the run's (`GenerateWorker.refused`, which the
    command line says in one line, exit status 2): stop as on SIGTERM, nothing requested."""
    asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)


def build_generate_app(
    settings: GenerateSettings,
    observe: ObserveSettings | None = None,
    once: OnceSettings | None = None,
) -> tuple[faust.App, GenerateWorker]:
    kafka = settings.kafka
    observe = observe or ObserveSettings()
    member = member_id(settings, observe, kafka.group(GENERATE_GROUP))
    app = create_app(
        kafka.group(GENERATE_GROUP),
        kafka,
        # Prefetch bounds what a worker holds beyond its in-flight requests, so a slow server
        # does not sit on a backlog that idle workers could take.
        prefetch=generate_prefetch(settings.starting_concurrency),
        instance_id=member,
    )
    stats = GenerateStats()
    backoff = generate_backoff(settings)  # the worker's, the ledger's and the leases' waits
    metrics = GenerateMetrics(settings.server, declared(GenerateStats))
    # each prompt once per generation settings (ledger), optionally stealing at the end
    once = once or OnceSettings()
    identity = member or settings.server
    guard = CrashGuard(observe.state_dir, f"{kafka.group(GENERATE_GROUP)}-{identity}")
    worker = GenerateWorker(
        settings,
        TimedClient(settings, stats, metrics.observe),
        kafka_sender(app),
        completions_topic=kafka.topic(COMPLETIONS),
        dead_letters_topic=kafka.topic(DEAD_LETTERS),
        ledger=LedgerFollower(kafka, backoff=backoff) if once.ledger else None,
        ledger_topic=kafka.topic(GENERATED),
        backoff=backoff,
        guard=guard,
        stats=stats,
        on_refused=stop_refused,
    )
    observe_generate(app, worker, metrics, observe)
    # the partitions' leases (streams/core/leases.py): where each resumes, a seek back over a
    # record not delivered, and the commit guard in faust's consumer thread
    starts = GroupStarts(kafka, kafka.group(GENERATE_GROUP), earliest=True, backoff=backoff)

    async def seek(tp: Any, offset: int) -> None:
        await app.consumer.seek(tp, offset)

    worker.intake.leases.connect(starts.start_of, seek, starts.first_at)
    guard_commits(app, worker.intake.leases)
    # each partition in turn, not whole backlogs one after another (streams/generate/fair.py)
    turns = FairTurns(lambda: app.consumer)

    @app.agent(raw_topic(app, kafka.topic(PROMPTS)), name="generate")
    async def generate(stream: Any) -> None:
        worker.start_soon()  # the agent starts before the group is joined: ask the server now
        # Acks are ours (ordered, after delivery): see streams/generate/intake.py.
        await consume(stream, guard, turns.wrap(worker.submit))

    @app.task
    async def end_idle_rounds() -> None:
        await turns.run()

    stealer: Stealer | None = None
    if once.steal_after_s > 0 and once.ledger:
        prompts = kafka.topic(PROMPTS)

        def owned() -> set[int]:
            return {tp.partition for tp in app.consumer.assignment() if tp.topic == prompts}

        backlogs = KafkaBacklogs(kafka, prompts, kafka.group(GENERATE_GROUP))
        stealer = stealing = Stealer(worker, backlogs, once, owned)
        if worker.once is not None:  # a worker alone in its group decides refusals itself
            worker.once.peers.group_size = backlogs.members

        @app.task
        async def steal() -> None:
            await stealing.run()

    # a revoked partition's requests go on under their claims (streams/generate/claims.py),
    # which its new owner reads before it requests anything
    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # faust types are narrower than its runtime
    async def on_revoked(sender: Any, *args: Any, **_: Any) -> None:
        await worker.revoke_partitions(args[0])  # faust sends the revoked set positionally

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(sender: Any, *args: Any, **_: Any) -> None:
        # a lease begun since the revocation, on a partition this assignment did not give us
        await worker.revoke_partitions(worker.intake.leases.not_in(args[0]))

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def on_shutdown(sender: Any, *_: Any, **__: Any) -> None:
        # faust has stopped fetching; the consumer is still in the group
        if settings.drain_s > 0 and worker.once is not None:
            try:
                await drain(app, worker, settings.drain_s, stealer)
            except Exception:  # the stop goes on: what is not finished is redone by others
                log.exception("finishing the requests in flight at shutdown failed")
        await worker.stop()
        await starts.close()

    return app, worker
