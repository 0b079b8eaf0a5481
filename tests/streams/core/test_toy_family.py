"""A family is one module: a toy family registered here (and nowhere else) is detected from its
chat template, rendered by the tokenize stage, parsed by SGLang's parsers, picked from a model
name, written by the emulator and taken by `--family`, with no change to any of them."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from compose.emulator import EmulatorSettings
from compose.emulator.generation import GenerationRequest, Generator
from compose.emulator.model import EmulatedModel
from streams.cli.flags import build
from streams.cli.main import build_parser
from streams.core.families import (
    FamilyProfile,
    ToolCall,
    detect_family,
    family_for_model,
    registered,
)
from streams.core.families.base import Message, TurnFormat, function_of, turn_parts
from streams.core.parsers import parse, split_reasoning, tool_start_token
from streams.core.records import CompletionRecord
from streams.core.settings import TokenizeSettings
from streams.core.tokenizers import load_tokenizer
from streams.tokenize.samples import SampleBuilder
from tests.ids import as_list

TOY_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{- '<|toy|>' + m['role'] + '\\n' + (m['content'] or '') + '<|/toy|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|toy|>assistant\\n' -}}{%- endif -%}"
)
CALL = re.compile(r"<call>(.*?)</call>", re.DOTALL)
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


@dataclass(frozen=True)
class ToyFormat(TurnFormat):
    """`<think>{reasoning}</think>{content}<call>{json}</call>…<|/toy|>` (the defaults: the
    generated message as it is, bare think tags)."""

    @property
    def tool_start(self) -> str | None:
        return "<call>"

    def turn(
        self,
        profile: FamilyProfile,
        generated: Message,
        *,
        finished: bool,
        calls_before: int,
        thinking: bool,
    ) -> str | None:
        reasoning, content, finished = turn_parts(generated, finished)
        text = profile.think_open + (reasoning or "") + profile.think_close + content
        calls = [function_of(call) for call in generated.get("tool_calls") or []]
        text += self.write_calls(
            [(str(f["name"]), json.loads(f["arguments"])) for f in calls], calls_before
        )
        return text + (profile.end_of_turn if finished else "")

    def parse_calls(
        self, text: str, tools: list[dict[str, Any]], history_calls: int
    ) -> tuple[str, list[ToolCall]]:
        start = text.find("<call>")
        if start < 0:
            return text, []
        calls = []
        for index, body in enumerate(CALL.findall(text), start=history_calls):
            call = json.loads(body)
            calls.append(ToolCall(f"toy_{index}", call["name"], json.dumps(call["arguments"])))
        return text[:start], calls

    def write_calls(self, calls: list[tuple[str, dict[str, Any]]], first_index: int) -> str:
        return "".join(
            f"<call>{json.dumps({'name': name, 'arguments': args})}</call>" for name, args in calls
        )


TOY = FamilyProfile(
    name="toy",
    thinking_kwarg="think",
    end_of_turn="<|/toy|>",
    reasoning_parser="toy",
    tool_call_parser="toy",
    format=ToyFormat(),
    template_markers=("<|toy|>", "<|/toy|>"),
    model_markers=("toy",),
)


@pytest.fixture()
def toy_dir(qwen36_tokenizer_dir: Path, tmp_path: Path) -> Path:
    """The tiny Qwen vocabulary with the toy family's chat template."""
    directory = shutil.copytree(qwen36_tokenizer_dir, tmp_path / "toy")
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = TOY_TEMPLATE
    config_path.write_text(json.dumps(config))
    return directory


@pytest.fixture()
def toy() -> Iterator[FamilyProfile]:
    with registered(TOY) as profile:
        yield profile


def test_the_tokenize_stage_renders_a_registered_family(toy_dir: Path, toy: FamilyProfile) -> None:
    loaded = load_tokenizer(toy_dir)  # as `worker tokenize` loads it
    assert loaded.profile.name == "toy"
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "find it"}],
        tools=TOOLS,
        reasoning_content="look it up",
        content="ok",
        tool_calls=[
            {
                "id": "x",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"q": "it"}'},
            }
        ],
        finish_reason="tool_calls",
    )
    builder = SampleBuilder(loaded.tokenizer, loaded.profile, prefer="rendered")
    sample = builder.build(completion)
    ids, mask = as_list(sample.input_ids), as_list(sample.loss_mask)
    start = mask.index(1)
    assert loaded.tokenizer.decode(ids[:start]) == "<|toy|>user\nfind it<|/toy|><|toy|>assistant\n"
    turn = loaded.tokenizer.decode(ids[start:])
    assert turn == (
        '<think>look it up</think>ok<call>{"name": "lookup", "arguments": {"q": "it"}}</call>'
        "<|/toy|>"
    )
    assert all(mask[start:])

    # SGLang's parsers (the emulator's answers, `--api native`) read it back by the name
    start_token = tool_start_token("toy")
    reasoning, content = split_reasoning(turn, "<think>", "</think>", False, start_token)
    assert reasoning == "look it up"
    content, calls = parse("toy", content.removesuffix("<|/toy|>"), TOOLS, 2)
    assert content == "ok"
    assert calls == [ToolCall("toy_2", "lookup", '{"q": "it"}')]
    # the generate client picks it from the served model's name
    assert family_for_model("acme/Toy-1B") is toy


def test_the_emulator_writes_a_registered_familys_tool_calls(
    toy_dir: Path, toy: FamilyProfile
) -> None:
    model = EmulatedModel(toy_dir)
    assert model.family.name == "toy"
    generator = Generator(model, EmulatorSettings(toy_dir, tool_call_rate=1.0))
    prompt = model.render([{"role": "user", "content": "find it"}], TOOLS, {"think": True})
    request = GenerationRequest(prompt, len(model.encode(prompt)), None, True, TOOLS)
    generation = generator.generate(request)
    assert generation.tool_call
    text = model.decode(generation.output_ids)
    reasoning, content = split_reasoning(text, "<think>", "</think>", False, "<call>")
    assert reasoning
    _, calls = model.family.parse_tool_calls(content, TOOLS, 0)
    assert [call.name for call in calls] == ["lookup"]


def test_an_unregistered_family_is_not_detected(toy_dir: Path) -> None:
    with registered(TOY):
        assert detect_family(toy_dir).name == "toy"
    assert detect_family(toy_dir).name == "generic"
    assert family_for_model("acme/Toy-1B").name == "generic"


def test_the_command_line_and_the_settings_take_a_registered_family(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def settings() -> TokenizeSettings:
        return TokenizeSettings(
            tokenizer_dir="t", dataset="v", storage={"out": "o"}, kafka={"bootstrap": "h:1"}
        )

    argv = ["worker", "tokenize", "--tokenizer-dir", "t", "--dataset", "v", "--out", "o"]
    argv += ["--bootstrap", "h:1", "--family", "toy"]
    with registered(TOY):
        args = build_parser(argv).parse_args(argv)
        assert build(TokenizeSettings, args).family == "toy"
        monkeypatch.setenv("DRAFTGEN_FAMILY", "toy")  # a settings file or the environment
        assert settings().family == "toy"
    with pytest.raises(
        ValidationError, match="'toy' is not a known model family: use one of kimi_k2"
    ):
        settings()
    with pytest.raises(SystemExit):  # argparse: invalid choice
        build_parser(argv).parse_args(argv)
