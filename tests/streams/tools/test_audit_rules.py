"""`draftgen audit`'s rules beyond "any outcome", on in-memory records: an outcome counts under
the dataset's generation settings only, a regenerate copy needs an outcome made from it, what
retention deleted, and a version's check of the completions below its offsets."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from streams.core.ledger import dead_key, ledger_key, settings_hash
from streams.core.records import CompletionRecord, DeadLetter, PromptRecord, origin_of
from streams.core.turns import EVERY_TURN, turn_prompt_id
from streams.tools.audit_check import Audit
from streams.tools.audit_dataset import VersionCheck, VersionResult, Window
from streams.tools.audit_ids import completion_facts
from streams.tools.audit_report import retention_of

MESSAGES = [{"role": "user", "content": "hi"}]
SAMPLING = {"temperature": 0.6, "top_p": 0.95, "max_tokens": 64, "seed": None}
A = settings_hash("model-a", SAMPLING, True, "final")
B = settings_hash("model-b", SAMPLING, True, "final")


@dataclass(frozen=True)
class Rec:
    key: bytes | None
    value: bytes | None
    partition: int = 0
    offset: int = 0


def prompt(pid: str, offset: int, published_at: float, regenerate: bool = False) -> Rec:
    meta = {"regenerate": True} if regenerate else {}
    record = PromptRecord(pid, MESSAGES, meta=meta, published_at=published_at)
    return Rec(pid.encode(), record.encode(), 0, offset)


def completion(pid: str, model: str = "model-a", published_at: float = 1.0) -> bytes:
    """Shaped as streams/generate/client.py writes it: sampling plus the thinking switch."""
    record = CompletionRecord(
        pid,
        MESSAGES,
        content="ok",
        model=model,
        sampling={**SAMPLING, "chat_template_kwargs": {"enable_thinking": True}},
        published_at=published_at,
    )
    return record.encode()


def test_a_completion_is_hashed_under_the_settings_its_worker_marks_in_the_ledger() -> None:
    facts = completion_facts(b"p", completion("p"))
    assert facts is not None and (facts.prompt_id, facts.settings) == ("p", A)
    off = CompletionRecord(
        "p",
        MESSAGES,
        model="model-a",
        sampling={**SAMPLING, "chat_template_kwargs": {"thinking": False}},
    )
    assert completion_facts(b"p", off.encode()).settings == (  # type: ignore[union-attr]
        settings_hash("model-a", SAMPLING, False, "final")
    )
    turn = turn_prompt_id("conv", 0, 2)
    facts = completion_facts(turn.encode(), completion(turn))
    assert facts is not None and (facts.own_id, facts.prompt_id) == (turn, "conv")
    assert facts.settings == settings_hash("model-a", SAMPLING, True, EVERY_TURN)
    assert completion_facts(b"x", b"not json") is None


def test_an_outcome_under_other_settings_does_not_count_for_the_dataset() -> None:
    check = Audit()
    check.completion(b"by-a", completion("by-a", "model-a"))
    check.completion(b"by-b", completion("by-b", "model-b"))
    check.ledger_mark(ledger_key("marked-b", B).encode())
    check.settle({A})
    check.prompts([prompt("by-a", 0, 1.0), prompt("by-b", 1, 1.0), prompt("marked-b", 2, 1.0)])
    result = check.result()
    assert sorted(m.prompt_id for m in result.listed) == ["by-b", "marked-b"]
    assert result.settings == {A: "model-a"}
    anyone = Audit()
    anyone.completion(b"by-b", completion("by-b", "model-b"))
    anyone.settle(None)
    anyone.prompts([prompt("by-b", 0, 1.0)])
    assert anyone.result().missing == 0


def test_a_dead_letter_counts_unless_the_ledger_marks_it_dead_under_other_settings_only() -> None:
    check = Audit()
    for pid in ("unmarked", "dead-b", "dead-both"):
        payload = PromptRecord(pid, MESSAGES).encode()
        check.dead_letter(
            DeadLetter.for_payload("generate", "http_400", "x", payload, pid).encode()
        )
    check.ledger_mark(dead_key("dead-b", B).encode())
    check.ledger_mark(dead_key("dead-both", B).encode())
    check.ledger_mark(dead_key("dead-both", A).encode())
    check.settle({A})
    check.prompts(
        [prompt(pid, i, 1.0) for i, pid in enumerate(["unmarked", "dead-b", "dead-both"])]
    )
    assert [m.prompt_id for m in check.result().listed] == ["dead-b"]


def test_a_regenerate_copy_needs_an_outcome_made_from_it() -> None:
    check = Audit({0: 3})
    check.completion(b"p", completion("p", published_at=1.0))  # the first copy's answer
    check.completion(b"q", completion("q", published_at=1.0))
    check.completion(b"q", completion("q", published_at=5.0))  # the regenerate copy's answer
    check.settle(None)
    first = check.prompts(
        [
            prompt("p", 0, 1.0),
            prompt("q", 1, 1.0),
            prompt("p", 2, 5.0, regenerate=True),
            prompt("q", 3, 5.0, regenerate=True),
        ]
    )
    assert first == []  # both have an outcome: nothing streamed out
    result = check.result()
    assert [(m.prompt_id, m.offset, m.state) for m in result.listed] == [
        ("p", 2, "lost-since-republished")
    ]
    assert [r.offset for r in check.regenerate_copies()] == [2]  # sent again as it was
    # a later regenerate copy of p, answered, settles it
    check.completion(b"p", completion("p", published_at=9.0))
    check.settle(None)
    check.prompts([prompt("p", 4, 9.0, regenerate=True)])
    assert check.result().missing == 0


def test_a_generate_dead_letter_of_the_regenerate_copy_is_its_outcome() -> None:
    check = Audit()
    check.completion(b"p", completion("p", published_at=1.0))
    copy = PromptRecord("p", MESSAGES, meta={"regenerate": True}, published_at=7.0).encode()
    check.dead_letter(DeadLetter.for_payload("generate", "http_400", "x", copy, "p").encode())
    check.settle(None)
    check.prompts([prompt("p", 0, 1.0), prompt("p", 1, 7.0, regenerate=True)])
    assert check.result().missing == 0


def test_retention_counts_what_the_generate_group_never_read() -> None:
    kept = retention_of({0: 10, 1: 4, 2: 0, 3: 6}, {0: 7, 1: 9, 2: 0})
    assert (kept.deleted, kept.unread, kept.unknown) == (20, 3, [3])


def test_a_claimed_prompt_gone_from_the_topic_without_an_outcome_is_reported() -> None:
    check = Audit()
    check.completion(b"answered", completion("answered"))
    check.ledger_mark(f"{ledger_key('gone', A)}!claim".encode())
    check.ledger_mark(f"{ledger_key('answered', A)}!claim".encode())
    check.ledger_mark(f"{ledger_key('here', A)}!claim".encode())
    check.prompts([prompt("here", 0, 1.0)])
    assert check.result().retention.claimed == ["gone"]


def hashed(*ids: str) -> np.ndarray:
    return np.sort(np.array([hash(i) for i in ids], dtype=np.int64))


def version(offsets: dict[int, int], sealed: bool = False) -> VersionCheck:
    windows = {
        0: [
            Window(0, 3, rows=hashed("a", "b"), kept=hashed("a"), drops=hashed("d")),
            # offsets 4 and 5: no window; 6..7 a shard the sealed manifest does not list
            Window(6, 7, rows=hashed("e"), kept=hashed("e"), drops=hashed(), listed=not sealed),
        ]
    }
    result = VersionResult(dataset="v", sealed=sealed, offsets=offsets)
    return VersionCheck(result, windows, "completions")


def test_every_completion_below_the_offsets_is_a_row_a_drop_or_a_dead_letter() -> None:
    check = version({0: 8})
    check.dead_letter("tokenize", origin_of("completions", 0, 4))
    check.dead_letter("generate", origin_of("completions", 0, 5))  # not the tokenize stage's
    check.completion(0, 0, "a", A)
    check.completion(0, 1, "b", A)  # a row a later answer replaced: still accounted
    check.completion(0, 2, "d", A)  # a recorded drop
    check.completion(0, 3, "x", A)  # not in its window
    check.unreadable(0, 4, None)  # dead-lettered by the tokenize stage
    check.completion(0, 5, "y", A)  # no window
    check.completion(0, 6, "e", B)
    check.completion(0, 8, "late", A)  # beyond the version: not judged
    result = check.finish()
    assert (result.checked, result.unaccounted) == (7, 2)
    assert [(u.offset, u.why) for u in result.listed] == [
        (3, "not in its window"),
        (5, "no window"),
    ]
    assert result.settings == Counter({A: 1, B: 1}) and result.mixed and not result.complete


def test_a_sealed_version_counts_only_the_shards_its_manifest_lists() -> None:
    check = version({0: 8}, sealed=True)
    check.completion(0, 6, "e", A)
    result = check.finish()
    assert [(u.offset, u.why) for u in result.listed] == [(6, "not in the manifest")]


def test_a_windows_sample_is_its_prompts_last_answer_there() -> None:
    check = version({0: 4})
    check.completion(0, 0, "a", B)
    check.completion(0, 1, "a", A)  # the window keeps this one
    result = check.finish()
    assert result.settings == Counter({A: 1}) and result.complete
