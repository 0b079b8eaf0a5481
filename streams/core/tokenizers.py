"""Load the target's tokenizer from a local directory (remote code allowed, like Kimi's): the
tokenize stage builds samples with it, the generate stage renders prompts for `--api native`."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
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
    tokenizer_sha256: str = ""  # `tokenizer_digest` of the directory

    def hashes(self) -> dict[str, str]:
        """What a sample's provenance and a version's manifest name the tokenizer by."""
        return {
            "chat_template_sha256": self.template_sha256,
            "tokenizer_sha256": self.tokenizer_sha256,
        }


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
        reason = missing_files(directory) or _one_line(str(err) or type(err).__name__)
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
        tokenizer_sha256=tokenizer_digest(directory),
    )


# the files that make a tokenizer besides its vocabulary; a model directory also holds weights,
# which are never read here
_TOKENIZER_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "merges.txt",
)


def tokenizer_digest(directory: Path) -> str:
    """sha256 over the tokenizer's own files (names and bytes, in name order): its config, its
    vocabulary and any remote code, so two directories that tokenize alike hash alike."""
    names = {*_TOKENIZER_FILES, *_VOCABULARIES, *(p.name for p in directory.glob("*.py"))}
    digest = hashlib.sha256()
    for name in sorted(names):
        path = directory / name
        if path.is_file():
            digest.update(name.encode() + b"\0")
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


# the files a vocabulary is read from, by the tokenizer classes transformers ships
_VOCABULARIES = ("tokenizer.json", "vocab.json", "tiktoken.model", "tokenizer.model", "vocab.txt")
# a remote-code tokenizer names its own: `VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}`
_VOCAB_FILES_NAMES = re.compile(r"VOCAB_FILES_NAMES\s*=\s*\{([^}]*)\}")


def missing_files(directory: Path) -> str | None:
    """What a directory that failed to load lacks, in words (None: nothing we can name). Read
    from the files alone: transformers' own message ends where its list of tried files would
    begin (`… from one of: `)."""
    config_path = directory / "tokenizer_config.json"
    if not config_path.is_file():
        if (directory / "tokenizer.json").is_file():
            return None
        return "it has neither tokenizer_config.json nor tokenizer.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as err:
        return f"tokenizer_config.json is not JSON ({_one_line(str(err))})"
    if not isinstance(config, dict):
        return "tokenizer_config.json is not a JSON object"
    auto_map = config.get("auto_map", {})
    remote = auto_map.get("AutoTokenizer") if isinstance(auto_map, dict) else None
    names = [n for n in remote if isinstance(n, str)] if isinstance(remote, list) else []
    modules = [directory / f"{name.split('.')[0]}.py" for name in names]
    absent = [m.name for m in modules if not m.is_file()]
    if absent:
        named = ", ".join(absent)
        return f"its tokenizer_config.json names remote code {named}, which is not there"
    wanted = [*_VOCABULARIES]
    for module in modules:
        found = _VOCAB_FILES_NAMES.search(module.read_text(errors="replace"))
        if found:
            wanted = re.findall(r":\s*[\"']([^\"']+)[\"']", found.group(1)) or wanted
            break
    present = [name for name in wanted if (directory / name).is_file()]
    if not present:
        return f"it has no vocabulary file ({' or '.join(wanted)})"
    if present == ["vocab.json"] and not (directory / "merges.txt").is_file():
        return "it has vocab.json but no merges.txt"
    return None


def _one_line(text: str) -> str:
    """An exception's text on one line: every line of it, joined, at most 300 characters."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())[:300]


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
