"""An SGLang-compatible emulated server: the stand-in for a GPU server in tests and local runs.

It renders prompts with the real chat template and tokenizer, "samples" deterministic thinking
outputs, and imitates SGLang's API (/v1/chat/completions, /generate, health and info routes)
and its failure modes (context-length 400s, a full queue's 503, 500s, hangs, dropped
connections, non-canonical token ids).
"""

from compose.emulator.app import build_app
from compose.emulator.server import run, serve
from compose.emulator.settings import EmulatorSettings, add_emulator_arguments, settings_from_args

__all__ = [
    "EmulatorSettings",
    "add_emulator_arguments",
    "build_app",
    "run",
    "serve",
    "settings_from_args",
]
