"""Model families: each one's behaviour in one module (kimi_k2.py, qwen3.py, generic.py), the
profile and format they share (base.py), and the registry that detects them (registry.py).

Adding a target model is one new module here (a `FamilyProfile` with its `TurnFormat`)
registered in `registry.FAMILIES`, plus its tests; the stages ask the profile, never compare
names, and `--family` takes the registered names.
"""

from streams.core.families.base import FamilyProfile, FormatError, ToolCall, TurnFormat
from streams.core.families.registry import (
    FAMILIES,
    GENERIC,
    KIMI_K2,
    QWEN3,
    TokenizerDirError,
    detect_family,
    family_for_model,
    family_named,
    read_chat_template,
    register,
    registered,
    unregister,
)

__all__ = [
    "FAMILIES",
    "GENERIC",
    "KIMI_K2",
    "QWEN3",
    "FamilyProfile",
    "FormatError",
    "TokenizerDirError",
    "ToolCall",
    "TurnFormat",
    "detect_family",
    "family_for_model",
    "family_named",
    "read_chat_template",
    "register",
    "registered",
    "unregister",
]
