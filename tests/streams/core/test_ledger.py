"""The generated ledger's keys and the once-worker's reading of prompt records."""

from __future__ import annotations

import asyncio
import time

import orjson

from streams.core.ledger import (
    DEAD_LETTER,
    DONE,
    REGENERATE,
    Claim,
    LedgerState,
    claim_key,
    dead_key,
    generated_prompt_ids,
    ledger_key,
    outcome_key,
    settings_hash,
    split_key,
    work_key,
)
from streams.core.settings import GENERATED, KafkaSettings
from streams.core.topics import topic_configs
from streams.generate.once import prompt_mode


def test_settings_hash_changes_with_every_generation_setting() -> None:
    base = settings_hash("m", {"temperature": 1.0, "top_p": 0.95}, True, "final")
    assert base == settings_hash("m", {"top_p": 0.95, "temperature": 1.0}, True, "final")
    assert base != settings_hash("m2", {"temperature": 1.0, "top_p": 0.95}, True, "final")
    assert base != settings_hash("m", {"temperature": 0.7, "top_p": 0.95}, True, "final")
    assert base != settings_hash("m", {"temperature": 1.0, "top_p": 0.95}, False, "final")
    assert base != settings_hash("m", {"temperature": 1.0, "top_p": 0.95}, True, "every-turn")


def test_keys_round_trip_even_with_separators_in_the_prompt_id() -> None:
    key = ledger_key("conv@1-t1of2", "abc")
    assert split_key(key) == ("conv@1-t1of2", "abc")
    assert generated_prompt_ids([key, ledger_key("p", "x"), ledger_key("p", "y")]) == {
        "conv@1-t1of2",
        "p",
    }


def test_prompt_mode_reads_regen_and_names_each_regenerate_publish() -> None:
    def record(meta: dict[str, object], published_at: float = 1.0) -> bytes:
        return orjson.dumps(
            {"prompt_id": "p", "messages": [], "meta": meta, "published_at": published_at}
        )

    assert prompt_mode(record({"row": 1})) == ("final", "", None)
    assert prompt_mode(record({"regen": "every-turn"})) == ("every-turn", "", None)
    regen, nonce, _ = prompt_mode(record({REGENERATE: True}))
    assert regen == "final" and nonce  # its own work key: the earlier outcome does not count
    assert prompt_mode(record({REGENERATE: True}, 2.0))[1] not in ("", nonce)  # another publish
    assert prompt_mode(record({REGENERATE: True}))[1] == nonce  # a redelivery of the same one
    assert prompt_mode(b"not json") == ("final", "", None)  # the stage dead-letters it


def test_a_claim_is_no_outcome_and_its_release_carries_the_outcome() -> None:
    """Readers of outcomes (publish, audit) do not count a claim; a release says how the
    request ended, so a reader that sees the prompt free knows its outcome, whatever partition
    the outcome key landed on."""
    state = LedgerState()
    work, now = ledger_key("p", "mine"), time.time()
    key = claim_key(work)
    assert outcome_key(key) is None and outcome_key(dead_key("p", "mine")) is not None
    assert generated_prompt_ids([key, dead_key("q", "mine"), ledger_key("r", "mine")]) == {"r"}
    claim = Claim("a", until=now + 30, at=now)
    state.take(key.encode(), claim.encode())
    assert state.holder(work) == claim and claim.holds()
    assert not state.settled(work) and state.keys == set()
    done = Claim("a", now + 1, released=True, at=now + 1, outcome=DONE)
    state.take(key.encode(), done.encode())
    assert state.holder(work) is None and state.settled(work) and state.contains("p", "mine")
    state.take(key.encode(), b"not a claim")  # a later version's, or damaged: ignored
    assert state.holder(work) is None


def test_one_holder_by_the_ledgers_order() -> None:
    """Every reader applies one rule in the ledger's order, so all agree on the holder: a claim
    wins over no holder, its holder's own renewal, or a holder lapsed when it was written; a
    release frees the prompt only when its holder wrote it."""
    state = LedgerState()
    work, now = ledger_key("p", "mine"), 1_000.0
    key = claim_key(work).encode()

    def take(claim: Claim) -> bool:
        won = claim.beats(state.holder(work))
        state.take(key, claim.encode())
        return won

    a = Claim("a", until=now + 15, at=now)
    assert take(a) and state.holder(work) == a
    assert not take(Claim("b", until=now + 20, at=now + 5))  # a holds: b loses
    assert state.holder(work) == a
    renewal = Claim("a", until=now + 20, at=now + 5)
    assert take(renewal) and state.holder(work) == renewal
    state.take(key, Claim("b", now + 6, released=True, at=now + 6).encode())  # not b's to free
    assert state.holder(work) == renewal
    late = Claim("b", until=now + 45, at=now + 30)  # a lapsed at now + 20 (killed, stalled)
    assert take(late) and state.holder(work) == late
    assert not take(Claim("a", until=now + 46, at=now + 31))  # a's late renewal loses
    state.take(key, Claim("a", now + 32, released=True, at=now + 32, outcome=DEAD_LETTER).encode())
    assert state.holder(work) == late  # a's release does not free b's claim...
    assert state.ended("p", "mine") and state.settled(work)  # ...but its outcome counts


def test_a_regenerate_publish_is_settled_only_by_its_own_outcome() -> None:
    state = LedgerState()
    state.add("p", "mine")  # generated before
    again = work_key("p", "mine", "n1")
    assert state.settled(ledger_key("p", "mine")) and not state.settled(again)
    released = Claim("a", 1.0, released=True, at=1.0, outcome=DONE)
    state.take(claim_key(again).encode(), released.encode())
    assert state.settled(again) and not state.settled(work_key("p", "mine", "n2"))


def test_a_claim_read_back_resolves_its_writers_wait() -> None:
    async def scenario() -> None:
        state = LedgerState()
        work = ledger_key("p", "mine")
        mine, theirs = Claim("a", until=10.0, at=1.0), Claim("b", until=10.0, at=0.5)
        won = state.expect(work, mine)
        state.take(claim_key(work).encode(), theirs.encode())  # read first: b holds it
        assert not won.done()
        state.take(claim_key(work).encode(), mine.encode())
        assert await asyncio.wait_for(won, 1) is False

    asyncio.run(scenario())


def test_a_watcher_wakes_at_the_next_record_of_its_work() -> None:
    async def scenario() -> None:
        state = LedgerState()
        work = ledger_key("p", "mine")
        watched = state.watch(work)
        state.take(ledger_key("q", "mine").encode(), b"{}")  # another prompt's
        assert not watched.is_set()
        state.take(dead_key("p", "mine").encode(), b"{}")
        assert watched.is_set() and state.settled(work)

    asyncio.run(scenario())


def test_claims_are_judged_on_the_brokers_clock_not_their_writers() -> None:
    """Two hosts 30 s off in opposite directions: read with the broker's append time, a claim
    lasts what its writer asked from when the broker took it, so neither host takes the other's
    live claim nor loses its own (on the writers' clocks, the host behind wrote a claim that had
    already ended, and every idle thief took the prompt from under it)."""
    work = ledger_key("p", "mine")
    key = claim_key(work).encode()
    behind, ahead = -30.0, 30.0  # each host's clock less the broker's
    state = LedgerState()
    held = Claim("late-host", until=1_000 + behind + 15, at=1_000 + behind)
    state.take(key, held.encode(), appended=1_000.0)
    holder = state.holder(work)
    assert holder is not None and (holder.start, holder.end) == (1_000.0, 1_015.0)
    assert holder.holds(now=1_010.0)  # a thief with a right clock sees it live
    early = Claim("early-host", until=1_005 + ahead + 15, at=1_005 + ahead)
    # written "at 1,035" by its clock, appended at 1,005: it loses...
    assert not Claim.decode(early.encode(), appended=1_005.0).beats(holder)  # type: ignore[union-attr]
    state.take(key, early.encode(), appended=1_005.0)
    assert state.holder(work) == holder  # ...in every reader
    renewal = Claim("late-host", until=1_012 + behind + 15, at=1_012 + behind)
    state.take(key, renewal.encode(), appended=1_012.0)
    renewed = state.holder(work)
    assert renewed is not None and renewed.end == 1_027.0
    # on the writers' clocks the late host's claim ended at 997 (before it was written)
    assert not Claim("x", until=985.0, at=970.0).holds(now=1_010.0)


def test_a_worker_learns_the_brokers_clock_from_its_own_claims_read_back() -> None:
    async def scenario() -> None:
        state = LedgerState()
        assert abs(state.now() - time.time()) < 1  # nothing read back yet: its own clock
        work = ledger_key("p", "mine")
        mine = Claim("a", until=time.time() + 15, at=time.time())
        state.expect(work, mine)
        state.take(claim_key(work).encode(), mine.encode(), appended=time.time() - 30)
        assert -40 < state.now() - time.time() < -29  # its clock runs 30 s ahead of the broker's

    asyncio.run(scenario())


def test_a_reader_starting_after_compaction_agrees_with_one_that_read_everything() -> None:
    """Compaction keeps a key's last record only, and not before `min.compaction.lag.ms`, set
    far above any claim's life (streams/core/topics.py): by then a prompt's claims have ended,
    and its last record (a release, or a claim long lapsed) tells a late reader what every
    record told the others."""
    work = ledger_key("p", "mine")
    key = claim_key(work).encode()
    records = [
        (Claim("a", 1_015.0, at=1_000.0), 1_000.0),
        (Claim("b", 1_020.0, at=1_005.0), 1_005.0),  # loses to a
        (Claim("a", 1_025.0, at=1_010.0), 1_010.0),  # a's renewal
        (Claim("a", 1_020.0, True, 1_020.0, DONE), 1_020.0),
    ]
    full, late = LedgerState(), LedgerState()
    for claim, appended in records:
        full.take(key, claim.encode(), appended)
    last, appended = records[-1]
    late.take(key, last.encode(), appended)
    for state in (full, late):
        assert state.holder(work) is None and state.settled(work)
    # what compaction before the claim ended would have done: b's record last, read as b's
    early = LedgerState()
    early.take(key, records[1][0].encode(), records[1][1])
    wrong = early.holder(work)
    assert wrong is not None and wrong.worker == "b"
    ledger = topic_configs(KafkaSettings(bootstrap="x:1"))[GENERATED]
    assert int(ledger["min.compaction.lag.ms"]) >= 3_600_000  # the lag keeps that from happening
    assert ledger["message.timestamp.type"] == "LogAppendTime"
