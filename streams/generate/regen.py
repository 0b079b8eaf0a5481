"""Multi-turn regeneration (`--regen every-turn`): every assistant turn, not just the last.

A prompt published with ``meta["regen"] == "every-turn"`` carries a whole conversation whose
earlier assistant turns are placeholders. The generate worker answers the first user turn,
puts the target's own answer in place of the first placeholder, answers the next user turn,
and so on; each answer is one completion, so one sample. Turn ``t`` of ``n`` gets the
prompt id ``{conversation_id}-t{t}of{n}`` (stable: the conversation's prompt id, the turn and
the count) and ``meta`` ``conversation_id``, ``turn``, ``turns``. Ids carry the count so
that `draftgen run` can tell a conversation done from its turns' ids alone.

Only conversations without tools in use qualify (no tool calls, no tool results: a tool turn
cannot be replayed without running the tool), shaped ``system* (user+ assistant)* user+``;
others are answered as usual, final turn only. A turn that leaves nothing to continue from
(cut by length, no content, or a tool call) ends the conversation: the remaining turns
become `regen_stopped` dead letters, so every turn id still ends as a sample or a dead letter.
All outputs are sent only once every turn is done, so a crash mid-conversation redoes the
whole conversation rather than mixing turns of two attempts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from streams.core.normalize import validate_prompt_messages
from streams.core.records import CompletionRecord, Message, PromptRecord, RecordError
from streams.core.turns import EVERY_TURN, STOPPED, turn_prompt_id
from streams.generate.client import GenerationError

Generate = Callable[[PromptRecord], Awaitable[CompletionRecord]]


@dataclass(frozen=True)
class TurnFailure:
    """A turn that did not become a completion: its dead letter's reason and payload."""

    prompt_id: str
    kind: str
    message: str
    payload: PromptRecord


# -- planning -------------------------------------------------------------------------------


def conversation_to_regenerate(value: bytes) -> tuple[PromptRecord, list[list[Message]]] | None:
    """The conversation and its user segments when `value` asks for every-turn regeneration
    and qualifies; None otherwise (the worker then handles it as a single prompt)."""
    if EVERY_TURN.encode() not in value:  # cheap test first: most prompts are final-turn
        return None
    try:
        prompt = PromptRecord.decode(value)
        validate_prompt_messages(prompt.messages, prompt.tools)
    except RecordError:
        return None  # the usual path dead-letters it with the reason
    if (prompt.meta or {}).get("regen") != EVERY_TURN:
        return None
    segments = user_segments(prompt.messages)
    return (prompt, segments) if segments is not None else None


def user_segments(messages: list[Message]) -> list[list[Message]] | None:
    """The messages to add before each generated turn: ``[[system…, user…], [user…], …]``,
    one segment per turn (earlier assistant turns are the boundaries and are dropped);
    None when the conversation does not qualify."""
    segments: list[list[Message]] = [[]]
    previous = None
    for message in messages:
        role = message.get("role")
        if role == "tool" or message.get("tool_calls"):
            return None
        if role == "assistant":
            if previous != "user":
                return None  # an answer to no user turn, or two answers in a row
            segments.append([])
        elif role == "system" and previous not in (None, "system"):
            return None  # a system message mid-conversation is not a turn's prompt
        else:
            segments[-1].append(message)
        previous = role
    if previous != "user":
        return None
    return segments


def turn_prompt(
    conversation: PromptRecord, history: list[Message], turn: int, turns: int
) -> PromptRecord:
    meta = {k: v for k, v in (conversation.meta or {}).items() if k != "regen"}
    meta.update(conversation_id=conversation.prompt_id, turn=turn, turns=turns)
    return replace(
        conversation,
        prompt_id=turn_prompt_id(conversation.prompt_id, turn, turns),
        messages=list(history),
        meta=meta,
    )


def continuation(completion: CompletionRecord) -> Message | str:
    """The answer to put in the history, or why the conversation cannot go on from it."""
    if completion.finish_reason == "length":
        return "it was cut by length"
    if completion.tool_calls:
        return "it is a tool call, and there is no tool result to continue with"
    if not (completion.content or "").strip():
        return "it has no content"
    return completion.generated_message()


# -- running --------------------------------------------------------------------------------


async def regenerate_turns(
    conversation: PromptRecord, segments: list[list[Message]], generate: Generate
) -> list[CompletionRecord | TurnFailure]:
    """One outcome per turn, in order; `generate` raises GenerationError for a turn that
    fails for good (retries and pauses are its business)."""
    turns = len(segments)
    history: list[Message] = []
    outcomes: list[CompletionRecord | TurnFailure] = []
    stop: str | None = None
    for turn, segment in enumerate(segments):
        history.extend(segment)
        prompt = turn_prompt(conversation, history, turn, turns)
        if stop is not None:
            # Its letter carries the conversation: re-publishing it regenerates the whole
            # conversation, and the turns already written are de-duplicated downstream.
            outcomes.append(TurnFailure(prompt.prompt_id, STOPPED, stop, conversation))
            continue
        try:
            completion = await generate(prompt)
        except GenerationError as err:
            outcomes.append(TurnFailure(prompt.prompt_id, err.kind, err.message, prompt))
            stop = f"turn {turn} failed ({err.kind})"
            continue
        outcomes.append(completion)
        answer = continuation(completion)
        if isinstance(answer, str):
            stop = f"turn {turn} leaves nothing to continue from: {answer}"
        else:
            history.append(answer)
    return outcomes
