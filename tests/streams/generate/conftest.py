"""The emulated server's fixtures (tests/compose/conftest.py), for the client's tests against it."""

from tests.compose.conftest import (  # noqa: F401  (fixtures, found by name)
    emulated_models,
    start_emulator,
    tiny_tokenizer_dirs,
)
