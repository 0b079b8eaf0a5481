"""Load the target's tokenizer from a local directory (remote code allowed, like Kimi's): the
tokenize stage builds samples with it, the generate stage renders prompts for `--api native`."""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from streams.core.families import (
    FamilyProfile,
    TokenizerDirError,
    detect_family,
    read_chat_template,
)


@dataclass(frozen=True)
class LoadedTokenizer:
    tokenizer: Any
    profile: FamilyProfile
    chat_template: str
    template_sha256: str
    directory: Path


def load_tokenizer(
    tokenizer_dir: str | Path, chat_template_file: str | None = None, family: str | None = None
) -> LoadedTokenizer:
    """Raises TokenizerDirError with one line saying what is wrong with the directory."""
    directory = Path(tokenizer_dir)
    if not directory.is_dir():
        raise TokenizerDirError(f"tokenizer directory {directory} does not exist")
    if not os.access(directory, os.R_OK | os.X_OK):
        raise TokenizerDirError(f"tokenizer directory {directory} is not readable")
    from transformers import AutoTokenizer

    # transformers logs loudly about remote code and missing files; our one line is enough.
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(directory), trust_remote_code=True, local_files_only=True
        )
    except Exception as err:
        reason = (str(err) or type(err).__name__).splitlines()[0][:300]
        raise TokenizerDirError(f"cannot load a tokenizer from {directory}: {reason}") from None
    template = read_chat_template(directory)
    if chat_template_file:
        path = Path(chat_template_file)
        if not path.is_file():
            raise TokenizerDirError(f"chat template file {path} does not exist")
        template = path.read_text()
        tokenizer.chat_template = template
    template = template or (getattr(tokenizer, "chat_template", None) or "")
    if not template:
        raise TokenizerDirError(f"tokenizer in {directory} has no chat template")
    # detected from the template that renders, the --chat-template file if there is one
    profile = detect_family(directory, family, template)
    return LoadedTokenizer(
        tokenizer=tokenizer,
        profile=profile,
        chat_template=template,
        template_sha256=hashlib.sha256(template.encode()).hexdigest(),
        directory=directory,
    )


@cache
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters: the alphabet in which
    byte-level BPE vocabularies (`tokenizer.json`) write their tokens."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = {byte: chr(byte) for byte in printable}
    for extra, byte in enumerate(b for b in range(256) if b not in chars):
        chars[byte] = chr(256 + extra)
    return chars


@cache
def unicode_to_byte() -> dict[str, int]:
    return {char: byte for byte, char in byte_to_unicode().items()}
