"""Multi-turn regeneration: turn plans, turn ids, completion tracking, and the generate hook."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from streams.core import turns
from streams.core.records import CompletionRecord, DeadLetter, PromptRecord
from streams.core.settings import GenerateSettings, KafkaSettings
from streams.generate import regen
from streams.generate.client import GenerationError
from streams.generate.outputs import Completion, Letter
from streams.generate.worker import GenerateWorker, generate_backoff
from tests.streams.generate.fakes import FakeClient

SYSTEM = {"role": "system", "content": "Be brief."}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


def conversation(*messages: dict[str, Any], mode: str = turns.EVERY_TURN) -> PromptRecord:
    return PromptRecord(
        prompt_id="c0ffee",
        messages=list(messages),
        source="src",
        meta=turns.mark({"row": 3}, mode),
    )


# -- ids and tracking -----------------------------------------------------------------------


def test_turn_ids_are_stable_and_parse_back() -> None:
    assert turns.turn_prompt_id("abc", 1, 3) == "abc-t1of3"
    assert turns.parse_turn_id("abc-t1of3") == ("abc", 1, 3)
    assert turns.parse_turn_id("a-b-t10of12") == ("a-b", 10, 12)
    assert turns.parse_turn_id("0123456789abcdef0123456789abcdef") is None
    assert turns.parse_turn_id("abc-t1ofx") is None


def test_a_conversation_is_finished_when_every_turn_ended() -> None:
    expected = {"conv", "plain"}
    assert turns.finished(expected, {"conv-t0of3", "conv-t2of3"}) == set()
    assert turns.finished(expected, {"conv-t0of3", "conv-t1of3", "conv-t2of3"}) == {"conv"}
    assert turns.finished(expected, {"plain", "other-t0of1"}) == {"plain"}
    # a conversation that failed as a whole (bad record) ends under its own id
    assert turns.finished(expected, {"conv"}) == {"conv"}


def test_mark_sets_the_mode() -> None:
    assert turns.mark({"row": 1}, turns.FINAL) == {"row": 1}
    assert turns.mark({"row": 1}, turns.EVERY_TURN) == {"row": 1, "regen": "every-turn"}
    with pytest.raises(ValueError):
        turns.mark({}, "sometimes")


# -- plans ----------------------------------------------------------------------------------


def test_user_segments_split_at_assistant_turns() -> None:
    messages = [SYSTEM, user("a"), assistant("A"), user("b"), user("b2"), assistant("B"), user("c")]
    assert regen.user_segments(messages) == [
        [SYSTEM, user("a")],
        [user("b"), user("b2")],
        [user("c")],
    ]
    assert regen.user_segments([user("only")]) == [[user("only")]]


@pytest.mark.parametrize(
    "messages",
    [
        # tools in use: a tool turn cannot be replayed without running the tool
        [
            user("a"),
            assistant("", tool_calls=[{"id": "x", "function": {"name": "f", "arguments": "{}"}}]),
            {"role": "tool", "tool_call_id": "x", "content": "out"},
        ],
        [user("a"), {"role": "tool", "tool_call_id": "x", "content": "out"}, user("b")],
        [SYSTEM, assistant("Hello!"), user("a")],  # an answer to no user turn
        [user("a"), assistant("A"), assistant("A2"), user("b")],
        [user("a"), assistant("A"), SYSTEM, user("b")],
    ],
)
def test_conversations_that_do_not_qualify(messages: list[dict[str, Any]]) -> None:
    assert regen.user_segments(messages) is None
    assert regen.conversation_to_regenerate(conversation(*messages).encode()) is None


def test_only_every_turn_prompts_are_expanded() -> None:
    messages = [user("a"), assistant("A"), user("b")]
    planned = regen.conversation_to_regenerate(conversation(*messages).encode())
    assert planned is not None and len(planned[1]) == 2
    final = conversation(*messages, mode=turns.FINAL).encode()
    assert regen.conversation_to_regenerate(final) is None
    assert regen.conversation_to_regenerate(b'{"regen": "every-turn", broken') is None


def test_turn_prompt_carries_the_conversation() -> None:
    prompt = regen.turn_prompt(conversation(user("a")), [user("a")], 0, 1)
    assert prompt.prompt_id == "c0ffee-t0of1"
    assert prompt.meta == {"row": 3, "conversation_id": "c0ffee", "turn": 0, "turns": 1}
    assert prompt.source == "src"


# -- running --------------------------------------------------------------------------------


class FakeModel(FakeClient):
    """Answers each turn with its position; scripted failures by turn."""

    def __init__(self, script: dict[int, Any] | None = None):
        super().__init__()
        self.script = script or {}
        self.prompts: list[PromptRecord] = []

    async def complete(self, prompt: PromptRecord) -> CompletionRecord:
        self.prompts.append(prompt)
        turn = prompt.meta.get("turn", 0)
        action = self.script.get(turn)
        if isinstance(action, Exception):
            raise action
        fields: dict[str, Any] = {
            "reasoning_content": f"thinking {turn}",
            "content": f"answer {turn}",
            "finish_reason": "stop",
            "usage": {"completion_tokens": 5},
        }
        fields.update(action or {})
        return CompletionRecord.from_prompt(prompt, **fields)


def run_turns(model: FakeModel, *messages: dict[str, Any]) -> list[Any]:
    planned = regen.conversation_to_regenerate(conversation(*messages).encode())
    assert planned is not None
    return asyncio.run(regen.regenerate_turns(*planned, model.complete))


def test_each_turn_answers_against_the_targets_own_earlier_answers() -> None:
    model = FakeModel()
    outcomes = run_turns(
        model, SYSTEM, user("a"), assistant("old A"), user("b"), assistant("old B"), user("c")
    )
    assert [o.prompt_id for o in outcomes] == ["c0ffee-t0of3", "c0ffee-t1of3", "c0ffee-t2of3"]
    assert all(isinstance(o, CompletionRecord) for o in outcomes)
    last = model.prompts[-1].messages
    assert [m["content"] for m in last] == [
        "Be brief.",
        "a",
        "answer 0",
        "b",
        "answer 1",
        "c",
    ]
    assert last[2]["reasoning_content"] == "thinking 0"
    assert "old A" not in orjson.dumps(model.prompts).decode()
    assert outcomes[1].meta["conversation_id"] == "c0ffee" and outcomes[1].meta["turn"] == 1
    assert "regen" not in outcomes[1].meta


@pytest.mark.parametrize(
    ("action", "why"),
    [
        ({"finish_reason": "length", "content": ""}, "cut by length"),
        ({"content": " "}, "no content"),
        (
            {"tool_calls": [{"id": "x", "function": {"name": "f", "arguments": "{}"}}]},
            "tool call",
        ),
    ],
)
def test_a_turn_without_an_answer_stops_the_conversation(action: dict[str, Any], why: str) -> None:
    model = FakeModel({1: action})
    outcomes = run_turns(model, user("a"), assistant("A"), user("b"), assistant("B"), user("c"))
    assert isinstance(outcomes[0], CompletionRecord) and isinstance(outcomes[1], CompletionRecord)
    stopped = outcomes[2]
    assert isinstance(stopped, regen.TurnFailure)
    assert stopped.prompt_id == "c0ffee-t2of3" and stopped.kind == turns.STOPPED
    assert why in stopped.message
    assert len(model.prompts) == 2


def test_a_failed_turn_is_a_dead_letter_and_stops_the_rest() -> None:
    model = FakeModel({0: GenerationError("context_too_long", "too long", transient=False)})
    outcomes = run_turns(model, user("a"), assistant("A"), user("b"))
    assert [(o.prompt_id, o.kind) for o in outcomes] == [
        ("c0ffee-t0of2", "context_too_long"),
        ("c0ffee-t1of2", turns.STOPPED),
    ]
    assert outcomes[0].payload.prompt_id == "c0ffee-t0of2"  # re-publishable as that turn
    assert outcomes[1].payload.prompt_id == "c0ffee"  # re-publishing redoes the conversation


# -- the generate worker's hook -------------------------------------------------------------


def make_worker(model: FakeModel) -> GenerateWorker:
    settings = GenerateSettings(
        server="http://fake", kafka=KafkaSettings(bootstrap="k:1"), max_attempts=1
    )

    async def send(topic: str, key: bytes, value: bytes) -> None:
        raise AssertionError("process_all does not send")

    worker = GenerateWorker(
        settings, model, send, "completions", "dead", backoff=generate_backoff(settings)
    )
    worker.gate.open()
    return worker


def test_generate_worker_emits_one_output_per_turn() -> None:
    model = FakeModel({1: {"finish_reason": "length"}})
    worker = make_worker(model)
    record = conversation(user("a"), assistant("A"), user("b"), assistant("B"), user("c"))
    outputs = asyncio.run(worker.stage.outputs(b"c0ffee", record.encode()))
    assert [(type(output), output.key) for output in outputs] == [
        (Completion, b"c0ffee-t0of3"),
        (Completion, b"c0ffee-t1of3"),
        (Letter, b"c0ffee-t2of3"),
    ]
    letter = DeadLetter.decode(outputs[2].value)
    assert letter.stage == "generate" and letter.kind == turns.STOPPED
    assert CompletionRecord.decode(outputs[0].value).meta["conversation_id"] == "c0ffee"
    assert worker.stats.completed == 2 and worker.stats.dead_letters == 1
    assert worker.stats.output_tokens == 10


def test_generate_worker_handles_other_prompts_as_before() -> None:
    model = FakeModel()
    worker = make_worker(model)
    final = conversation(user("a"), assistant("A"), user("b"), mode=turns.FINAL)
    (output,) = asyncio.run(worker.stage.outputs(b"c0ffee", final.encode()))
    assert (type(output), output.key) == (Completion, b"c0ffee")
    assert CompletionRecord.decode(output.value).meta == {"row": 3}
    # every-turn but with tools in use: the final turn only, under the conversation's id
    tools = conversation(
        user("a"),
        assistant("", tool_calls=[{"id": "x", "function": {"name": "f", "arguments": "{}"}}]),
        {"role": "tool", "tool_call_id": "x", "content": "out"},
    )
    (output,) = asyncio.run(worker.stage.outputs(b"c0ffee", tools.encode()))
    assert (type(output), output.key) == (Completion, b"c0ffee")
    (output,) = asyncio.run(worker.stage.outputs(b"bad", b"not json every-turn"))
    assert isinstance(output, Letter) and DeadLetter.decode(output.value).kind == "not_json"
