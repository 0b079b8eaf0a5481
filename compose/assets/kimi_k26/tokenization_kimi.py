"""Kimi-style tiktoken tokenizer, shipped as remote code next to `tiktoken.model`.

Mirrors the behaviour of Moonshot's K2.5/K2.6 `tokenization_kimi.py` that matters to draftgen:
a slow `PreTrainedTokenizer` over tiktoken, 256 reserved special ids after the BPE ranks, the
K2 pre-tokenizer regex, `encode()` without kwargs going straight to tiktoken with specials
allowed, and `apply_chat_template` defaulting to `add_generation_prompt=True`, `tokenize=False`,
`thinking=True`, `preserve_thinking=False`, with the tools key-sorted and rendered
TypeScript-style into the template variable `tools_ts_str` (tool_declaration_ts.py, as the
real repository's).
Written for transformers 4.51+ and 5.x; loaded with `trust_remote_code=True`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from shutil import copyfile
from typing import Any

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import PreTrainedTokenizer

from .tool_declaration_ts import encode_tools_to_typescript_style

VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}

# Offsets of the named specials after the BPE ranks; the others are reserved slots.
NAMED_SPECIALS: dict[int, str] = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "[EOT]",
    10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>",
    12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>",
    15: "<|tool_call_end|>",
    17: "<|im_middle|>",
    22: "<think>",
    23: "</think>",
    254: "[UNK]",
    255: "[PAD]",
}
NUM_RESERVED_SPECIAL_TOKENS = 256

# Kimi K2's pre-tokenizer: Han runs, cased words with contractions, up to 3 digits, ...
PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


def _bytes_to_unicode() -> dict[int, str]:
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def deep_sort_dict(obj: Any) -> Any:
    """Kimi sorts tool schemas by key before rendering them."""
    if isinstance(obj, dict):
        return {k: deep_sort_dict(v) for k, v in sorted(obj.items())}
    if isinstance(obj, list):
        return [deep_sort_dict(item) for item in obj]
    return obj


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]  # noqa: RUF012

    def __init__(
        self,
        vocab_file: str,
        bos_token: str = "[BOS]",
        eos_token: str = "[EOS]",
        unk_token: str = "[UNK]",
        pad_token: str = "[PAD]",
        **kwargs: Any,
    ) -> None:
        if not os.path.isfile(vocab_file):
            raise FileNotFoundError(vocab_file)
        self.vocab_file = vocab_file
        mergeable_ranks = load_tiktoken_bpe(vocab_file)
        base = len(mergeable_ranks)
        self.special_tokens = {
            NAMED_SPECIALS.get(i, f"<|reserved_token_{base + i}|>"): base + i
            for i in range(NUM_RESERVED_SPECIAL_TOKENS)
        }
        self.model = tiktoken.Encoding(
            name=Path(vocab_file).name,
            pat_str=PAT_STR,
            mergeable_ranks=mergeable_ranks,
            special_tokens=self.special_tokens,
        )
        self.n_words = self.model.n_vocab
        self.byte_encoder = _bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in self.byte_encoder.items()}
        self.decoder: dict[int, str] = {}
        for i in range(self.n_words):
            raw = self.model.decode_single_token_bytes(i)
            self.decoder[i] = "".join(self.byte_encoder[b] for b in raw)
        self.encoder = {text: i for i, text in self.decoder.items()}
        self.unk_id = self.special_tokens[str(unk_token)]
        super().__init__(
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
            **kwargs,
        )

    @property
    def vocab_size(self) -> int:
        return self.n_words

    def get_vocab(self) -> dict[str, int]:
        return dict(self.encoder)

    def encode(  # type: ignore[override,unused-ignore]
        self, text: str, allow_special_tokens: bool = True, **kwargs: Any
    ) -> list[int]:
        """Plain `encode(text)` goes straight to tiktoken (specials allowed), like Kimi's."""
        if kwargs:
            return super().encode(text, **kwargs)
        if allow_special_tokens:
            return self.model.encode(text, allowed_special="all")
        return self.model.encode(text, disallowed_special=())

    def decode(self, token_ids: Any, **kwargs: Any) -> str:  # type: ignore[override]
        if kwargs:
            decoded: Any = super().decode(token_ids, **kwargs)
            return decoded
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        return self.model.decode(list(token_ids))

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        # Specials were split off by the added-token trie; encode the rest as ordinary text.
        return [self.decoder[t] for t in self.model.encode(text, disallowed_special=())]

    def _convert_token_to_id(self, token: str) -> int:
        return self.encoder.get(token, self.unk_id)

    def _convert_id_to_token(self, index: int) -> str:
        return self.decoder.get(index, "")

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        text = "".join(tokens)
        return bytearray(self.byte_decoder[c] for c in text).decode("utf-8", "replace")

    @staticmethod
    def clean_up_tokenization(out_string: str) -> str:
        return out_string

    def save_vocabulary(
        self, save_directory: str, filename_prefix: str | None = None
    ) -> tuple[str]:
        out = os.path.join(
            save_directory, (filename_prefix + "-" if filename_prefix else "") + "tiktoken.model"
        )
        if os.path.abspath(self.vocab_file) != os.path.abspath(out):
            copyfile(self.vocab_file, out)
        return (out,)

    def apply_chat_template(  # type: ignore[override]
        self,
        conversation: Any,
        tools: list[dict[str, Any]] | None = None,
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        thinking: bool = True,
        preserve_thinking: bool = False,
        **kwargs: Any,
    ) -> Any:
        # Kimi's defaults: render to text, with the generation prompt, thinking on.
        tools = deep_sort_dict(tools)
        if tools:
            # as the real code: a failure leaves it unset and the template prints JSON
            with contextlib.suppress(Exception):
                kwargs["tools_ts_str"] = encode_tools_to_typescript_style(tools)
        return super().apply_chat_template(
            conversation,
            tools=tools,  # type: ignore[arg-type]
            tokenize=tokenize,
            add_generation_prompt=add_generation_prompt,
            thinking=thinking,
            preserve_thinking=preserve_thinking,
            **kwargs,
        )
