"""An SGLang-compatible emulated server: the stand-in for a GPU server in tests and local runs.

It renders prompts with the real chat template and tokenizer, "samples" deterministic thinking
outputs, and imitates SGLang's API (/v1/chat/completions, /generate, health and info routes)
and its failure modes (context-length 400s, a full queue's 503, 500s, hangs, dropped
connections, non-canonical token ids).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compose.emulator.app import build_app
    from compose.emulator.flags import add_emulator_arguments, settings_from_args
    from compose.emulator.server import run, serve
    from compose.emulator.settings import EmulatorSettings

# Imported on first use: the server's modules load transformers (~2 s), and every `draftgen`
# command imports the emulator's settings for its flags, workers included.
_HOMES = {
    "build_app": "compose.emulator.app",
    "run": "compose.emulator.server",
    "serve": "compose.emulator.server",
    "EmulatorSettings": "compose.emulator.settings",
    "add_emulator_arguments": "compose.emulator.flags",
    "settings_from_args": "compose.emulator.flags",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EmulatorSettings",
    "add_emulator_arguments",
    "build_app",
    "run",
    "serve",
    "settings_from_args",
]
