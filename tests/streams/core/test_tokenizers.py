"""load_tokenizer: the profile is detected from the template in use (`--chat-template` too)."""

from __future__ import annotations

from pathlib import Path

from streams.core.tokenizers import load_tokenizer

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
