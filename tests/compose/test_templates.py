"""The shipped chat templates render exactly as the real Qwen3.6 and Kimi K2.6 templates do.

template_references.json holds conversations rendered by the real templates (and Kimi's real
TypeScript tool encoder); template_references.py says where they come from and rebuilds it.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from compose import tiny_tokenizers as tt
from streams.core.tokenizers import load_tokenizer

REFERENCES = json.loads(
    (Path(__file__).parent / "template_references.json").read_text(encoding="utf-8")
)
TEMPLATES = tt.ASSETS / "templates"


def _render(tokenizer: Any, case: dict[str, Any]) -> dict[str, str]:
    try:
        text = tokenizer.apply_chat_template(
            case["messages"], tools=case.get("tools"), tokenize=False, **case["kwargs"]
        )
    except Exception as err:
        return {"error": type(err).__name__}
    return {"text": text}


def _expected(case: dict[str, Any]) -> dict[str, str]:
    return {key: case[key] for key in ("text", "error") if key in case}


@pytest.fixture(scope="module")
def tokenizers(qwen36_tokenizer_dir: Path, kimi_k26_tokenizer_dir: Path) -> dict[str, Any]:
    return {
        "qwen36": AutoTokenizer.from_pretrained(qwen36_tokenizer_dir),
        "kimi_k26": AutoTokenizer.from_pretrained(kimi_k26_tokenizer_dir, trust_remote_code=True),
    }


@pytest.mark.parametrize(
    ("family", "index"),
    [(family, i) for family in ("qwen36", "kimi_k26") for i in range(len(REFERENCES[family]))],
)
def test_shipped_template_renders_as_the_real_one(
    tokenizers: dict[str, Any], family: str, index: int
) -> None:
    case = REFERENCES[family][index]
    assert _render(tokenizers[family], case) == _expected(case)


@pytest.mark.parametrize("index", range(len(REFERENCES["typescript"])))
def test_kimi_tool_declarations_match_the_real_encoder(index: int) -> None:
    spec = importlib.util.spec_from_file_location("tool_declaration_ts", tt.KIMI_TS_CODE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    case = REFERENCES["typescript"][index]
    try:
        result = {"text": module.encode_tools_to_typescript_style(case["tools"])}
    except Exception as err:
        result = {"error": type(err).__name__}
    assert result == _expected(case)


@pytest.mark.parametrize("family", ["qwen36", "kimi_k26"])
def test_a_chat_template_override_renders_as_the_real_one(
    tiny_tokenizer_dirs: dict[str, Path], tmp_path: Path, family: str
) -> None:
    """A directory carrying another template, overridden by the shipped file with
    --chat-template: the rendering and the detected profile follow the override."""
    directory = tmp_path / family
    shutil.copytree(tiny_tokenizer_dirs[family], directory)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = "{% for m in messages %}{{ m.content }}{% endfor %}"
    config_path.write_text(json.dumps(config))

    plain = load_tokenizer(directory)
    assert plain.profile.name == "generic"
    loaded = load_tokenizer(directory, str(TEMPLATES / f"{family}.jinja"))
    assert loaded.profile.name == {"qwen36": "qwen3", "kimi_k26": "kimi_k2"}[family]
    assert loaded.profile.prefills_think and loaded.profile.preserve_thinking
    for case in REFERENCES[family]:
        assert _render(loaded.tokenizer, case) == _expected(case)
