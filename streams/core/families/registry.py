"""The known model families, and which one a chat template or a served model name is.

Callers ask here instead of comparing family names: `detect_family` (the tokenizer directory's or
the `--chat-template` file's template), `family_for_model` (the name a server reports),
`family_named` (a `--family` override). A family is one module of this package that builds a
`FamilyProfile`, registered in `FAMILIES` (the built-in ones below; a test's toy family with
`registered`): the one list, from which `--family`'s choices and accepted values come.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from streams.core.families import generic, kimi_k2, qwen3
from streams.core.families.base import FamilyProfile
from streams.core.registry import Registry

log = logging.getLogger(__name__)

KIMI_K2 = kimi_k2.FAMILY
QWEN3 = qwen3.FAMILY
GENERIC = generic.FAMILY
# Detection tries them in this order (a family registered later comes after them); generic has
# no markers and is the fallback.
FAMILIES: Registry[FamilyProfile] = Registry(
    "model family", ((profile.name, profile) for profile in (KIMI_K2, QWEN3, GENERIC))
)


def register(profile: FamilyProfile) -> FamilyProfile:
    """Add a family (detected after the ones before it); its name must be new."""
    return FAMILIES.register(profile.name, profile)


def unregister(name: str) -> None:
    FAMILIES.unregister(name)


@contextmanager
def registered(profile: FamilyProfile) -> Iterator[FamilyProfile]:
    """The family is known inside the block only (tests)."""
    with FAMILIES.registered(profile.name, profile):
        yield profile


def family_named(name: str) -> FamilyProfile:
    return FAMILIES.named(name)


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
        return family_named(override).for_template(template)
    for profile in FAMILIES.values():
        if profile.matches_template(template):
            return profile.for_template(template)
    log.warning(
        "chat template in %s matches no known model family; using the generic profile",
        tokenizer_dir,
    )
    return GENERIC
