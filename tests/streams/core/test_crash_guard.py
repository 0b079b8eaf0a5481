"""The crash record: two crashes in a row on one offset make it a dead letter, once."""

from __future__ import annotations

from pathlib import Path

from streams.core.crash_guard import CrashGuard


def restarted(tmp_path: Path) -> CrashGuard:
    return CrashGuard(tmp_path, "generate-w1")


def test_two_crashes_on_one_offset_poison_it_for_the_next_start_once(tmp_path: Path) -> None:
    restarted(tmp_path).crashed("prompts", 3, 41, ValueError("bad\nsecond line"))
    first = restarted(tmp_path)
    assert first.poisoned("prompts", 3, 41) is None  # one crash: handled again
    first.crashed("prompts", 3, 41, ValueError("bad"))
    second = restarted(tmp_path)
    assert second.poisoned("prompts", 3, 40) is None
    assert second.poisoned("prompts", 2, 41) is None
    error = second.poisoned("prompts", 3, 41)
    assert error is not None and "ValueError: bad" in error and "second line" not in error
    assert second.poisoned("prompts", 3, 41) is None  # dead-lettered once
    assert restarted(tmp_path).poisoned("prompts", 3, 41) is None


def test_a_crash_on_another_offset_starts_the_count_again(tmp_path: Path) -> None:
    restarted(tmp_path).crashed("prompts", 0, 5, RuntimeError("x"))
    restarted(tmp_path).crashed("prompts", 0, 6, RuntimeError("x"))
    assert restarted(tmp_path).poisoned("prompts", 0, 6) is None
    assert restarted(tmp_path).poisoned("prompts", 0, 5) is None


def test_an_unreadable_record_is_ignored(tmp_path: Path) -> None:
    guard = restarted(tmp_path)
    guard.path.write_text("{not json")
    assert restarted(tmp_path).poisoned("prompts", 0, 0) is None
