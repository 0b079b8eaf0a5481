"""Family profiles are detected from the chat template actually used."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from streams.cli.main import build_parser
from streams.core.families import (
    FAMILIES,
    GENERIC,
    KIMI_K2,
    QWEN3,
    detect_family,
    family_for_model,
    family_named,
    register,
    unregister,
)

QWEN36_GENERATION = (
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)
QWEN3_GENERATION = "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
KIMI_K26 = (
    "{{- '<|im_user|>user<|im_middle|>' }}{%- if add_generation_prompt -%}"
    "{{- '<|im_assistant|>assistant<|im_middle|><think>' }}{%- endif -%}"
)
CHATML_END = "{{- '<|im_end|>' }}"


def _directory(tmp_path: Path, template: str) -> Path:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return tmp_path


def test_the_template_in_use_beats_the_directorys(tmp_path: Path) -> None:
    """`--chat-template` replaced a Qwen3.6 directory's template with a Kimi or an older Qwen
    one: the profile follows the template that renders."""
    directory = _directory(tmp_path, CHATML_END + QWEN36_GENERATION)
    assert detect_family(directory).name == "qwen3"
    assert detect_family(directory).prefills_think
    assert detect_family(directory, template=KIMI_K26).name == "kimi_k2"
    older = detect_family(directory, template=CHATML_END + QWEN3_GENERATION)
    assert older.name == "qwen3" and not older.prefills_think
    # a family override is refined by the template in use too
    assert not detect_family(directory, "qwen3", CHATML_END + QWEN3_GENERATION).prefills_think
    assert detect_family(directory, template="{{ messages }}").name == "generic"


@pytest.mark.parametrize(
    ("arguments", "as_json"),
    [
        # Qwen3.6: a string as is, anything else tojson
        ("args_value | string if args_value is string else args_value | tojson", True),
        # Qwen3.5: tojson for mappings and lists, `| string` for the rest
        ("args_value | tojson if args_value is mapping else args_value | string", False),
    ],
)
def test_qwen_argument_style_is_read_from_the_template(
    tmp_path: Path, arguments: str, as_json: bool
) -> None:
    template = CHATML_END + "{%- set args_value = " + arguments + " %}" + QWEN36_GENERATION
    assert detect_family(_directory(tmp_path, template)).tool_args_json is as_json


def test_the_registry_keeps_built_in_families_and_unique_names() -> None:
    assert [FAMILIES[name] for name in ("kimi_k2", "qwen3", "generic")] == [KIMI_K2, QWEN3, GENERIC]
    with pytest.raises(ValueError, match="already registered"):
        register(replace(QWEN3, template_markers=()))
    with pytest.raises(ValueError, match="built in"):
        unregister("qwen3")
    with pytest.raises(ValueError, match=r"unknown model family 'llama'; known: kimi_k2, qwen3"):
        family_named("llama")
    # served model names pick the family; a --family override wins
    assert family_for_model("moonshotai/Kimi-K2.6") is KIMI_K2
    assert family_for_model("Qwen/Qwen3.6-35B-A3B") is QWEN3
    assert family_for_model("meta-llama/Llama-3") is GENERIC
    assert family_for_model("Qwen/Qwen3.6", "kimi_k2") is KIMI_K2


def test_the_family_setting_offers_exactly_the_registered_families() -> None:
    """`--family` takes its choices from the registry (`FAMILIES`); the docs' row points at
    `--help` (tests/test_docs_registries.py)."""
    registered = tuple(FAMILIES)
    assert {"kimi_k2", "qwen3", "generic"} <= set(registered)  # the built-in ones
    for command in (["worker", "generate"], ["worker", "tokenize"]):
        for name in registered:
            argv = [*command, "--family", name]
            assert build_parser(argv).parse_args(argv).family == name
