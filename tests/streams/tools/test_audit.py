"""`draftgen audit`'s check on in-memory records: a prompt has an outcome when a completion, a
dead letter or a ledger mark (completed or `!dead`, any settings) names it, or names one of its
turns (`--regen every-turn`); the others are listed with where they are, once each, and counted
past the listing's limit."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson

from streams.core.ledger import claim_key, dead_key, ledger_key
from streams.core.records import CompletionRecord, DeadLetter, PromptRecord
from streams.core.settings import KafkaSettings
from streams.core.turns import turn_prompt_id
from streams.tools.audit import republish_command
from streams.tools.audit_check import Audit
from streams.tools.audit_ids import HashedIds

MESSAGES = [{"role": "user", "content": "hi"}]
SETTINGS = "0123456789abcdef"


@dataclass(frozen=True)
class Rec:
    key: bytes | None
    value: bytes | None
    partition: int = 0
    offset: int = 0


def prompt(prompt_id: str, partition: int, offset: int, key: bool = True) -> Rec:
    record = PromptRecord(prompt_id, MESSAGES, source="s.jsonl", source_id=f"row-{prompt_id}")
    return Rec(prompt_id.encode() if key else None, record.encode(), partition, offset)


def completion(prompt_id: str) -> Rec:
    return Rec(prompt_id.encode(), CompletionRecord(prompt_id, MESSAGES, content="ok").encode())


def letter(prompt_id: str | None) -> bytes:
    payload = PromptRecord(prompt_id or "x", MESSAGES).encode()
    return DeadLetter.for_payload("generate", "http_400", "too long", payload, prompt_id).encode()


def astuple(record: Rec) -> tuple[bytes | None, bytes | None]:
    return record.key, record.value


def audited(prompts: list[Rec], committed: dict[int, int] | None = None, **kw: int) -> Audit:
    check = Audit(committed, **kw)
    check.completion(*astuple(completion("done")))
    check.completion(None, CompletionRecord("done-unkeyed", MESSAGES).encode())
    check.dead_letter(letter("failed"))
    check.dead_letter(letter(None))  # no prompt id: nobody's outcome
    check.dead_letter(b"not a letter")
    check.ledger_mark(ledger_key("marked", SETTINGS).encode())
    check.ledger_mark(dead_key("marked-dead", SETTINGS).encode())
    # a request running: no outcome
    check.ledger_mark(claim_key(ledger_key("claimed", SETTINGS)).encode())
    check.ledger_mark(None)
    # --regen every-turn: turns are completed and dead-lettered under their own ids
    check.completion(*astuple(completion(turn_prompt_id("conv", 0, 2))))
    check.dead_letter(letter(turn_prompt_id("conv", 1, 2)))
    check.dead_letter(letter(turn_prompt_id("conv-failed", 0, 1)))
    check.prompts(prompts)
    return check


ANSWERED = ["done", "done-unkeyed", "failed", "marked", "marked-dead", "conv", "conv-failed"]


def test_a_prompt_with_any_outcome_is_not_listed() -> None:
    records = [prompt(pid, 0, offset) for offset, pid in enumerate(ANSWERED)]
    result = audited(records).result()
    assert (result.prompts, result.records, result.missing, result.listed) == (
        len(ANSWERED),
        len(ANSWERED),
        0,
        [],
    )
    assert result.lines("x")[0] == f"every prompt has an outcome ({len(ANSWERED)} prompts)"
    # the ledger's claim of a prompt not in the topic (and without an outcome) is one whose
    # record is gone: reported as lost to retention, so the audit is not complete
    assert result.retention.claimed == ["claimed"] and not result.complete


def test_each_prompt_without_an_outcome_is_listed_with_where_it_is() -> None:
    records = [
        prompt("done", 0, 0),
        prompt("lost", 1, 5),
        prompt("waiting", 1, 9),
        prompt("unkeyed", 2, 3, key=False),
        # a turn's id answers its conversation, not a prompt named like another turn
        prompt(turn_prompt_id("conv", 2, 2), 2, 4),
    ]
    check = audited(records, committed={1: 6})
    result = check.result()
    assert (result.prompts, result.records, result.missing, result.pending) == (5, 5, 4, 3)
    assert [(m.prompt_id, m.source, m.source_id, m.position, m.pending) for m in result.listed] == [
        ("lost", "s.jsonl", "row-lost", "1@5", False),
        ("waiting", "s.jsonl", "row-waiting", "1@9", True),
        ("unkeyed", "s.jsonl", "row-unkeyed", "2@3", True),
        ("conv-t2of2", "s.jsonl", "row-conv-t2of2", "2@4", True),
    ]
    lines = result.lines("draftgen audit --republish")
    assert lines[0] == (
        "4 of 5 prompts have no outcome (3 not yet committed by the generate workers: "
        "still pending while a run goes on)"
    )
    header = ["prompt", "id", "source", "source", "id", "partition@offset", "state"]
    assert lines[1].split() == header
    assert lines[2].split() == ["lost", "s.jsonl", "row-lost", "1@5", "lost"]
    assert "republish them: draftgen audit --republish" in lines


def test_a_claim_in_the_ledger_is_no_outcome() -> None:
    """A revoked prompt's old owner finishing its request: the prompt has no outcome yet."""
    result = audited([prompt("claimed", 0, 0)]).result()
    assert [m.prompt_id for m in result.listed] == ["claimed"]


def test_a_prompt_published_twice_is_one_prompt_at_its_latest_copy() -> None:
    check = Audit({0: 5})
    check.completion(*astuple(completion("done")))
    first = check.prompts([prompt("again", 0, 2), prompt("done", 0, 3)])
    check_later = check.prompts([prompt("again", 0, 7)])
    # republish sends the first copy only
    assert [r.offset for r in first] == [2] and check_later == []
    result = check.result()
    assert (result.prompts, result.records, result.missing, result.pending) == (2, 3, 1, 1)
    again = next(m for m in result.listed if m.prompt_id == "again")
    assert (again.offset, again.copies, again.pending) == (7, 2, True)


def test_past_the_listing_limit_prompts_are_counted_not_kept() -> None:
    check = Audit({0: 100}, listed=2)
    records = [prompt(f"p{i}", 0, i) for i in range(5)]
    assert len(check.prompts(records)) == 5  # every one is republished
    check.prompts([prompt("p4", 0, 200)])  # its latest copy is pending
    result = check.result()
    assert (result.missing, result.pending, len(result.listed)) == (5, 1, 2)
    assert result.lines("c")[-2] == "  … and 3 more"
    data = orjson.loads(orjson.dumps(result.as_json("c")))
    assert (data["missing"], data["listed"], data["republish_command"]) == (5, 2, "c")
    assert data["missing_prompts"][0] == {
        "prompt_id": "p0",
        "source": "s.jsonl",
        "source_id": "row-p0",
        "partition": 0,
        "offset": 0,
        "state": "lost",
        "copies": 1,
        "republished": False,
    }


def test_a_bad_prompt_record_is_listed_by_its_key() -> None:
    result = audited([Rec(b"garbled", b"\xff not json", 3, 1)]).result()
    assert [(m.prompt_id, m.source, m.source_id, m.position) for m in result.listed] == [
        ("garbled", "", None, "3@1")
    ]


def test_hashed_ids_stay_unique_across_many_repeats() -> None:
    ids = HashedIds()
    for round_ in range(3):
        for i in range(100_000):
            ids.add(f"id-{i}")
        assert len(ids) == 100_000, round_
    asked = np.array([hash("id-5"), hash("id-99999"), hash("nope")], dtype=np.int64)
    assert ids.contains(asked).tolist() == [True, True, False]
    assert HashedIds().contains(asked).tolist() == [False, False, False]


def test_the_republish_command_names_the_broker_and_prefix() -> None:
    kafka = KafkaSettings(bootstrap="k1:9092", topic_prefix="t1-")
    assert republish_command(["/v/bin/draftgen"], kafka) == (
        "/v/bin/draftgen audit --bootstrap k1:9092 --topic-prefix t1- --republish"
    )
    plain = KafkaSettings(bootstrap="k1:9092")
    assert republish_command(["py", "-m", "streams"], plain) == (
        "py -m streams audit --bootstrap k1:9092 --republish"
    )
