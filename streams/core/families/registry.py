"""The known model families, and which one a chat template or a served model name is.

Callers ask here instead of comparing family names: `detect_family` (the tokenizer directory's or
the `--chat-template` file's template), `family_for_model` (the name a server reports),
`family_named` (a `--family` override). A family is one module of this package that builds a
`FamilyProfile`; it is listed in `BUILT_IN`, or `register`ed (a test's toy family).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from streams.core.families import generic, kimi_k2, qwen3
from streams.core.families.base import FamilyProfile

log = logging.getLogger(__name__)

KIMI_K2 = kimi_k2.FAMILY
QWEN3 = qwen3.FAMILY
GENERIC = generic.FAMILY
# detection tries them in this order; generic has no markers and is the fallback
BUILT_IN: tuple[FamilyProfile, ...] = (KIMI_K2, QWEN3, GENERIC)

FAMILIES: dict[str, FamilyProfile] = {profile.name: profile for profile in BUILT_IN}


def register(profile: FamilyProfile) -> FamilyProfile:
    """Add a family (detected after the ones before it); its name must be new."""
    if profile.name in FAMILIES:
        raise ValueError(f"model family {profile.name!r} is already registered")
    FAMILIES[profile.name] = profile
    return profile


def unregister(name: str) -> None:
    if any(profile.name == name for profile in BUILT_IN):
        raise ValueError(f"model family {name!r} is built in")
    FAMILIES.pop(name, None)


@contextmanager
def registered(profile: FamilyProfile) -> Iterator[FamilyProfile]:
    """The family is known inside the block only (tests)."""
    register(profile)
    try:
        yield profile
    finally:
        unregister(profile.name)


def family_named(name: str) -> FamilyProfile:
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_for_model(model: str, override: str | None = None) -> FamilyProfile:
    """The family of a served model name (`--family` wins); generic when none matches."""
    if override:
        return family_named(override)
    for profile in FAMILIES.values():
        if profile.matches_model(model):
            return profile
    return GENERIC


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
        return _refine(family_named(override), template)
    for profile in FAMILIES.values():
        if profile.matches_template(template):
            return _refine(profile, template)
    log.warning(
        "chat template in %s matches no known model family; using the generic profile",
        tokenizer_dir,
    )
    return GENERIC


def _refine(profile: FamilyProfile, template: str) -> FamilyProfile:
    """Older family members differ: K2-Thinking / Qwen3 do not prefill <think>; Qwen3.5 prints
    scalar tool arguments with `| string`."""
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
