"""Model-family profiles: what the chat template and reasoning parser of each target family do.

Chosen from the tokenizer directory (overridable); facts from shared notes/model-templates.md.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FamilyProfile:
    name: str
    # chat_template_kwargs key that turns thinking on
    thinking_kwarg: str | None
    # token that ends an assistant turn (and is the stop token)
    end_of_turn: str
    think_open: str = "<think>"
    think_close: str = "</think>"
    # the generation prompt already ends with `<think>` (K2.5/K2.6, Qwen3.5/3.6)
    prefills_think: bool = False
    # the template accepts preserve_thinking=True (keeps history reasoning)
    preserve_thinking: bool = False
    # SGLang --reasoning-parser name
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    # Qwen tool-call arguments that are not strings print as JSON (`true`, `null`, `3`; Qwen3.6),
    # or with Python's str() unless a mapping or list (`True`, `None`; Qwen3.5's `| string`)
    tool_args_json: bool = True

    def template_kwargs(self, thinking: bool = True) -> dict[str, Any]:
        return {self.thinking_kwarg: thinking} if self.thinking_kwarg else {}


KIMI_K2 = FamilyProfile(
    name="kimi_k2",
    thinking_kwarg="thinking",
    end_of_turn="<|im_end|>",
    prefills_think=True,
    preserve_thinking=True,
    reasoning_parser="kimi_k2",
    tool_call_parser="kimi_k2",
)
QWEN3 = FamilyProfile(
    name="qwen3",
    thinking_kwarg="enable_thinking",
    end_of_turn="<|im_end|>",
    prefills_think=True,
    preserve_thinking=True,
    reasoning_parser="qwen3",
    tool_call_parser="qwen3_coder",
)
GENERIC = FamilyProfile(name="generic", thinking_kwarg=None, end_of_turn="")

FAMILIES = {profile.name: profile for profile in (KIMI_K2, QWEN3, GENERIC)}


class TokenizerDirError(ValueError):
    """The tokenizer directory is missing or unreadable."""


def read_chat_template(tokenizer_dir: Path) -> str:
    """The chat template a directory carries (chat_template.jinja or tokenizer_config.json)."""
    jinja = tokenizer_dir / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    config_path = tokenizer_dir / "tokenizer_config.json"
    if not config_path.exists():
        return ""
    config = json.loads(config_path.read_text())
    template = config.get("chat_template") or ""
    if isinstance(template, list):  # named templates: take the default one
        named = {t.get("name"): t.get("template", "") for t in template}
        template = named.get("default") or next(iter(named.values()), "")
    return str(template)


def detect_family(
    tokenizer_dir: Path, override: str | None = None, template: str | None = None
) -> FamilyProfile:
    """Pick the profile from the template's turn tokens; unknown templates fall back to generic.

    `template` is the chat template actually used (a `--chat-template` file overrides the
    directory's): the profile must describe what renders the prompts, not what the directory
    happens to carry."""
    if template is None:
        template = read_chat_template(tokenizer_dir)
    if override:
        if override not in FAMILIES:
            raise ValueError(f"unknown model family {override!r}; known: {', '.join(FAMILIES)}")
        return _refine(FAMILIES[override], template)
    if "<|im_assistant|>" in template and "<|im_middle|>" in template:
        return _refine(KIMI_K2, template)
    if "<|im_start|>" in template and "<|im_end|>" in template:
        return _refine(QWEN3, template)
    log.warning(
        "chat template in %s matches no known model family; using the generic profile",
        tokenizer_dir,
    )
    return GENERIC


def _refine(profile: FamilyProfile, template: str) -> FamilyProfile:
    """Older family members differ: K2-Thinking / Qwen3 do not prefill <think>; Qwen3.5 prints
    scalar tool arguments with `| string`."""
    from dataclasses import replace

    if not template:
        return profile
    return replace(
        profile,
        preserve_thinking="preserve_thinking" in template,
        prefills_think=_template_prefills_think(template, profile),
        # Qwen3.5 tests for a mapping or list first and falls back to `| string`
        tool_args_json="args_value is mapping" not in template,
    )


def _template_prefills_think(template: str, profile: FamilyProfile) -> bool:
    # The generation-prompt block is the tail after `add_generation_prompt`.
    index = template.rfind("add_generation_prompt")
    return index >= 0 and profile.think_open in template[index:]
