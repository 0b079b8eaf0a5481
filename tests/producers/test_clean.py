"""Cleaning prompts at publish (producers/clean.py): the same text published once, whitespace
aside; prompts that contain an evaluation task found by word n-grams and named with the match."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.clean import (
    EvalNgrams,
    NearDuplicates,
    PromptCleaner,
    load_cleaner,
    normalized_text,
)
from streams.core.normalize import make_prompt_record

EVAL_TASKS = Path(__file__).parent / "fixtures" / "eval_tasks.jsonl"


def prompt(text: str, system: str | None = None) -> object:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": text})
    return make_prompt_record({"messages": messages}, "src.jsonl", {})


def test_prompts_that_differ_in_whitespace_only_are_one_text() -> None:
    a = prompt("Sort  this list:\n\n[3, 1, 2]")
    b = prompt("Sort this list: [3, 1,   2]  ")
    assert a.prompt_id != b.prompt_id  # the id hashes the exact content
    assert normalized_text(a) == normalized_text(b)
    assert normalized_text(prompt("sort this list: [3, 1, 2]")) != normalized_text(a)  # case
    assert normalized_text(prompt("x", system="y")) != normalized_text(prompt("y x"))  # roles


def test_the_first_of_a_text_is_kept_and_the_others_named_with_it() -> None:
    cleaner = PromptCleaner()
    first, again, other = prompt("a  b"), prompt("a b"), prompt("a c")
    assert cleaner.check(first) is None and cleaner.check(other) is None
    removal = cleaner.check(again)
    assert removal is not None and removal.kind == "duplicate_text"
    assert first.prompt_id in removal.message
    assert cleaner.check(first) is None  # the first is still the first
    assert PromptCleaner(dedup_text=False).check(again) is None


def test_a_prompt_holding_an_evaluation_task_is_contaminated_with_the_words_it_shares() -> None:
    cleaner = load_cleaner(True, [str(EVAL_TASKS)], n=13)
    assert cleaner.evals is not None and cleaner.evals.texts == 9  # every string of each row
    leaked = prompt(
        "Please solve this:\n\ndef running_maximum(numbers):\n    '''Return a list whose i-th "
        "element is the largest of the first i + 1 numbers of the input list.'''"
    )
    removal = cleaner.check(leaked)
    assert removal is not None and removal.kind == "contaminated"
    assert "evaluation set eval_tasks.jsonl" in removal.message  # its name, not a path
    assert "return a list whose i th element is the largest" in removal.message
    # a few shared words are not a task; nor is a string shorter than the n-gram ("1 pm")
    assert cleaner.check(prompt("Return a list whose elements are sorted, please.")) is None
    assert cleaner.check(prompt("The meeting is at 1 pm")) is None
    # the same words in another case and spacing are the same n-gram
    shouting = "A TRAIN LEAVES THE STATION AT NINE IN THE MORNING TRAVELLING AT SIXTY MILES"
    assert cleaner.check(prompt(shouting)) is not None


def test_a_shorter_ngram_finds_shorter_overlaps() -> None:
    evals = EvalNgrams(5)
    evals.add("set", [{"q": "one two three four five six"}])
    assert evals.match("zero one two three four five") == ("set", "one two three four five")
    assert EvalNgrams(13).match("one two three four five") is None


def test_an_evaluation_set_that_cannot_be_read_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_cleaner(True, [str(tmp_path / "missing.jsonl")])


PARAGRAPH = (
    "Write a function that reads a CSV file of orders, groups them by customer, and returns "
    "the three customers with the largest total spend, breaking ties by the earliest first "
    "order. The file may be large, so read it as a stream and keep memory bounded. Explain "
    "the complexity of your approach and how you would test it with a file of a million rows. "
    "Some orders are refunds with a negative amount; they count against the customer's total. "
    "Customer names are not unique, so group by the customer id column, and report the name "
    "that appears on the most recent order. Dates come in two formats, ISO 8601 and the "
    "American month/day/year; reject a row whose date parses in neither and count how many "
    "were rejected. Finally, write the result as JSON with the customer id, the name, the "
    "total and the number of orders, sorted from the largest total down."
)


def test_a_prompt_with_one_sentence_changed_is_a_near_duplicate_of_the_first() -> None:
    cleaner = PromptCleaner(near=NearDuplicates(0.8))
    first = prompt(PARAGRAPH)
    edited = prompt(PARAGRAPH + " Use only the standard library, please.")
    unrelated = prompt("Explain how TCP congestion control reacts to a lost packet. " * 3)
    assert cleaner.check(first) is None and cleaner.check(unrelated) is None
    removal = cleaner.check(edited)
    assert removal is not None and removal.kind == "near_duplicate"
    assert first.prompt_id in removal.message
    # without the setting it is published: its text differs, not only its whitespace
    assert PromptCleaner().check(first) is None and PromptCleaner().check(edited) is None


def test_near_duplicates_leave_out_the_system_prompt_an_agents_prompts_share() -> None:
    system = "You are a coding agent. " + PARAGRAPH * 4
    cleaner = PromptCleaner(near=NearDuplicates(0.8))
    assert cleaner.check(prompt("Fix the failing test in parser.py", system=system)) is None
    assert cleaner.check(prompt("Add a --verbose flag to the CLI", system=system)) is None


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=30, max_size=60, unique=True))
def test_prompts_that_share_no_words_are_never_near_duplicates(numbers: list[int]) -> None:
    near = NearDuplicates(0.8)
    half = len(numbers) // 2
    a = [f"w{n}" for n in numbers[:half]]
    b = [f"w{n}" for n in numbers[half:]]
    assert near.check("a", a) is None and near.check("b", b) is None
    assert near.check("a2", list(a)) == "a"  # the same words: found, named by the first
