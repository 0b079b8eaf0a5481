"""load_tokenizer: the profile is detected from the template in use (`--chat-template` too), and
a directory it cannot load is told what it lacks."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from streams.core.families import TokenizerDirError
from streams.core.tokenizers import load_tokenizer, tokenizer_digest

# A Qwen3-style template (the model writes <think> itself): no prefill after the prompt.
QWEN3_TEMPLATE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_the_profile_follows_the_chat_template_override(
    qwen36_tokenizer_dir: Path, tmp_path: Path
) -> None:
    assert load_tokenizer(qwen36_tokenizer_dir).profile.prefills_think
    template = tmp_path / "qwen3.jinja"
    template.write_text(QWEN3_TEMPLATE)
    loaded = load_tokenizer(qwen36_tokenizer_dir, str(template))
    assert loaded.chat_template == QWEN3_TEMPLATE
    assert loaded.profile.name == "qwen3"
    assert not loaded.profile.prefills_think and not loaded.profile.preserve_thinking
    rendered = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def _copy(source: Path, target: Path, *names: str) -> Path:
    target.mkdir()
    for name in names:
        shutil.copy(source / name, target / name)
    return target


def _refusal(directory: Path) -> str:
    with pytest.raises(TokenizerDirError) as refused:
        load_tokenizer(directory)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"cannot load a tokenizer from {directory}")
    return message.removeprefix(f"cannot load a tokenizer from {directory}: ")


def test_a_directory_that_does_not_load_is_told_what_it_lacks(
    kimi_k26_tokenizer_dir: Path, qwen36_tokenizer_dir: Path, tmp_path: Path
) -> None:
    """transformers' own message ends at `… from one of: `; ours names the missing file."""
    code = _copy(kimi_k26_tokenizer_dir, tmp_path / "code", "tokenization_kimi.py")
    assert _refusal(code) == "it has neither tokenizer_config.json nor tokenizer.json"

    no_vocab = _copy(
        kimi_k26_tokenizer_dir,
        tmp_path / "no-vocab",
        "tokenization_kimi.py",
        "tool_declaration_ts.py",
        "tokenizer_config.json",
    )
    # the remote code's own vocabulary file, read from its VOCAB_FILES_NAMES
    assert _refusal(no_vocab) == "it has no vocabulary file (tiktoken.model)"

    no_code = _copy(
        kimi_k26_tokenizer_dir, tmp_path / "no-code", "tokenizer_config.json", "tiktoken.model"
    )
    assert _refusal(no_code) == (
        "its tokenizer_config.json names remote code tokenization_kimi.py, which is not there"
    )

    config = orjson.loads((qwen36_tokenizer_dir / "tokenizer_config.json").read_bytes())
    config.pop("tokenizer_file", None)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer_config.json").write_bytes(orjson.dumps(config))
    assert _refusal(bare).startswith("it has no vocabulary file (tokenizer.json or vocab.json")

    (bare / "tokenizer_config.json").write_text("{not json")
    assert _refusal(bare).startswith("tokenizer_config.json is not JSON")


def test_the_tokenizer_hash_follows_its_files_not_the_rest_of_the_directory(
    kimi_k26_tokenizer_dir: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(kimi_k26_tokenizer_dir, copy)
    first = load_tokenizer(copy).hashes()
    assert set(first) == {"chat_template_sha256", "tokenizer_sha256"}
    (copy / "model-00001-of-00064.safetensors").write_bytes(b"weights")
    assert tokenizer_digest(copy) == first["tokenizer_sha256"]
    (copy / "tokenization_kimi.py").write_text(
        (copy / "tokenization_kimi.py").read_text() + "\n# changed\n"
    )
    assert tokenizer_digest(copy) != first["tokenizer_sha256"]
