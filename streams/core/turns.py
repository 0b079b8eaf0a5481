"""Turn ids and modes of `--regen every-turn`, shared by publish, generate and `run`.

Turn ``t`` of ``n`` of a conversation gets the prompt id ``{conversation_id}-t{t}of{n}``; ids
carry the count so that `draftgen run` can tell a conversation done from its turns' ids alone.
The regeneration itself is streams/generate/regen.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

EVERY_TURN = "every-turn"
FINAL = "final"
REGEN_MODES = (FINAL, EVERY_TURN)
STOPPED = "regen_stopped"
_TURN_ID = re.compile(r"^(?P<conversation>.+)-t(?P<turn>\d+)of(?P<turns>\d+)$")


# -- ids ------------------------------------------------------------------------------------


def turn_prompt_id(conversation_id: str, turn: int, turns: int) -> str:
    return f"{conversation_id}-t{turn}of{turns}"


def parse_turn_id(prompt_id: str) -> tuple[str, int, int] | None:
    """(conversation id, turn, turns) of a turn's prompt id; None for any other id."""
    if "of" not in prompt_id:  # a substring test is much cheaper than the regex
        return None
    match = _TURN_ID.match(prompt_id)
    if match is None:
        return None
    return match["conversation"], int(match["turn"]), int(match["turns"])


def finished(expected: Iterable[str], ended: set[str]) -> set[str]:
    """The expected prompt ids that are done: ended themselves (a sample or a dead letter), or
    conversations whose every turn ended."""
    expected = set(expected)
    done = expected & ended
    turns: dict[str, set[int]] = {}
    counts: dict[str, int] = {}
    for prompt_id in ended:
        parsed = parse_turn_id(prompt_id)
        if parsed is None or parsed[0] not in expected:
            continue
        conversation, turn, count = parsed
        turns.setdefault(conversation, set()).add(turn)
        counts[conversation] = count
    done.update(c for c, seen in turns.items() if len(seen) >= counts[c])
    return done


def among(prompt_id: str, prompt_ids: frozenset[str] | set[str]) -> bool:
    """Whether a completion's prompt id is one of `prompt_ids`, or a turn of a conversation
    that is."""
    if prompt_id in prompt_ids:
        return True
    parsed = parse_turn_id(prompt_id)
    return parsed is not None and parsed[0] in prompt_ids


def mark(meta: dict[str, Any], mode: str) -> dict[str, Any]:
    """A prompt record's meta for the given mode (publish side)."""
    if mode not in REGEN_MODES:
        raise ValueError(f"regen mode must be one of {REGEN_MODES}, not {mode!r}")
    return {**meta, "regen": EVERY_TURN} if mode == EVERY_TURN else meta
