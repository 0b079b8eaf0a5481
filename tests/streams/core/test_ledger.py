"""The generated ledger's keys and the once-worker's reading of prompt records."""

from __future__ import annotations

import asyncio
import time

import orjson

from streams.core.ledger import (
    REGENERATE,
    Claim,
    LedgerFollower,
    LedgerState,
    claim_key,
    dead_key,
    generated_prompt_ids,
    ledger_key,
    outcome_key,
    settings_hash,
    split_key,
)
from streams.core.settings import KafkaSettings
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


def test_prompt_mode_reads_regen_and_regenerate() -> None:
    plain = orjson.dumps({"prompt_id": "p", "messages": [], "meta": {"row": 1}})
    forced = orjson.dumps({"prompt_id": "p", "messages": [], "meta": {REGENERATE: True}})
    turns = orjson.dumps({"prompt_id": "p", "messages": [], "meta": {"regen": "every-turn"}})
    assert prompt_mode(plain) == ("final", False)
    assert prompt_mode(forced) == ("final", True)
    assert prompt_mode(turns) == ("every-turn", False)
    assert prompt_mode(b"not json")[1] is True  # never skipped: the worker dead-letters it


def test_a_follower_restricted_to_a_workers_settings_keeps_only_their_keys() -> None:
    """A worker learns its settings hashes once it knows its model: from then on the follower
    holds one key per prompt generated with them, not every generation ever recorded."""
    follower = LedgerFollower(KafkaSettings(bootstrap="127.0.0.1:9"))  # never connected to
    follower.add("a", "mine")
    follower.add_dead("b", "every-turn-mine")
    follower.add("a", "another-model")
    follower.add_dead("c", "another-model")
    follower.restrict({"mine", "every-turn-mine"})
    assert follower.keys == {ledger_key("a", "mine"), dead_key("b", "every-turn-mine")}
    assert follower.contains("a", "mine") and follower.ended("b", "every-turn-mine")
    assert not follower.ended("c", "another-model")


def test_a_claim_is_no_outcome_and_its_release_or_lapse_ends_it() -> None:
    """A revoked prompt's old owner claims it while its request runs: readers of outcomes
    (publish, audit) do not count it; a worker keeps the last claim written until released."""
    state = LedgerState()
    key = claim_key("p", "mine")
    assert outcome_key(key) is None and outcome_key(dead_key("p", "mine")) is not None
    assert generated_prompt_ids([key, dead_key("q", "mine"), ledger_key("r", "mine")]) == {"r"}
    claim = Claim("worker-a", until=time.time() + 30)
    state.take(key.encode(), claim.encode())
    assert state.claim("p", "mine") == claim and claim.holds()
    assert not state.ended("p", "mine") and state.keys == set()
    renewed = Claim("worker-a", until=claim.until + 10)
    state.take(key.encode(), renewed.encode())
    assert state.claim("p", "mine") == renewed
    state.take(key.encode(), Claim("worker-a", time.time(), released=True).encode())
    assert state.claim("p", "mine") is None
    assert not Claim("worker-b", until=time.time() - 1).holds()  # lapsed: not renewed
    state.take(key.encode(), b"not a claim")  # a later version's, or damaged: ignored
    assert state.claim("p", "mine") is None


def test_claims_are_kept_only_for_a_workers_settings() -> None:
    state = LedgerState()
    claim = Claim("w", until=time.time() + 30).encode()
    state.take(claim_key("a", "mine").encode(), claim)
    state.take(claim_key("b", "another-model").encode(), claim)
    state.restrict({"mine"})
    assert set(state.claims) == {ledger_key("a", "mine")}
    state.take(claim_key("c", "another-model").encode(), claim)
    assert state.claim("c", "another-model") is None


def test_a_waiter_wakes_at_the_next_record() -> None:
    async def scenario() -> None:
        state = LedgerState()
        waiter = asyncio.ensure_future(state.changed())
        await asyncio.sleep(0)
        assert not waiter.done()
        state.take(ledger_key("p", "mine").encode(), b"{}")
        await asyncio.wait_for(waiter, 1)
        assert state.contains("p", "mine")

    asyncio.run(scenario())
