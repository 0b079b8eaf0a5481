"""Kimi-style tiktoken tokenizer, shipped as remote code next to `tiktoken.model`.

Mirrors the behaviour of Moonshot's K2.5/K2.6 `tokenization_kimi.py` that matters to draftgen:
a slow `PreTrainedTokenizer` over tiktoken, 256 reserved special ids after the BPE ranks, the
K2 pre-tokenizer regex, `encode()` without kwargs going straight to tiktoken with specials
allowed, and `apply_chat_template` defaulting to `add_generation_prompt=True`, `tokenize=False`,
`thinking=True`, `preserve_thinking=False`, with the tools key-sorted and rendered
TypeScript-style into the template variable `tools_ts_str` (the real repository's
`tool_declaration_ts.py`, re-implemented below to render the same text).
Written for transformers 4.51+ and 5.x; loaded with `trust_remote_code=True`.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from shutil import copyfile
from typing import Any

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import PreTrainedTokenizer

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


# --- TypeScript tool declarations -------------------------------------------------------------
# What K2.5/K2.6's tool_declaration_ts.py renders: a `namespace functions` with one
# `type NAME = (_: {...}) => any;` per OpenAI function tool, JSON-schema properties as fields
# (required ones first, each group by name), descriptions and some constraints as `//` lines,
# $defs as interfaces. Only tools shaped {"type": "function", "function": {...}} are rendered;
# anything the real encoder rejects raises here too (the template then prints JSON).

_INDENT = "  "
_CONSTRAINTS = {
    "string": ("maxLength", "minLength", "pattern"),
    "number": ("maximum", "minimum"),
    "integer": ("maximum", "minimum"),
}
_UNION_NAMES = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "null": "null",
    "object": "{}",
    "array": "Array<any>",
}


def _comment(text: str, indent: str = "") -> str:
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


class _Schemas:
    """The $defs seen so far, and whether the root refers to itself (`$ref: "#"`)."""

    def __init__(self) -> None:
        self.definitions: dict[str, Any] = {}
        self.self_ref = False

    def resolve(self, ref: str) -> dict[str, Any]:
        if ref == "#":
            self.self_ref = True
            return {"$self_ref": True}
        if ref.startswith("#/$defs/"):
            name = ref.split("/")[-1]
            if name not in self.definitions:
                raise ValueError(f"Reference not found: {ref}")
            return dict(self.definitions[name])
        raise ValueError(f"Unsupported reference format: {ref}")


class _Type:
    """One schema node: its TypeScript text and the comment lines printed above a field."""

    def __init__(self, schema: dict[str, Any], constraint_keys: tuple[str, ...] = ()) -> None:
        self.description = schema.get("description", "")
        self.constraints = {k: v for k, v in schema.items() if k in constraint_keys}

    def ts(self, indent: str = "") -> str:
        raise NotImplementedError

    def doc(self, indent: str) -> str:
        lines = []
        if self.description:
            lines.append(_comment(self.description, indent))
        if self.constraints:
            pairs = sorted(self.constraints.items())
            lines.append(f"{indent}// " + ", ".join(f"{k}: {v}" for k, v in pairs))
        return "".join(line + "\n" for line in lines)


class _Scalar(_Type):
    def __init__(self, kind: Any, schema: dict[str, Any] | None = None) -> None:
        super().__init__(schema or {}, _CONSTRAINTS.get(kind, ()))
        self.kind = kind

    def ts(self, indent: str = "") -> str:
        return "number" if self.kind == "integer" else str(self.kind)


class _Field:
    def __init__(self, name: str, kind: _Type, optional: bool, default: Any) -> None:
        self.name, self.kind, self.optional, self.default = name, kind, optional, default

    def ts(self, indent: str) -> str:
        text = self.kind.doc(indent)
        if self.default is not None:
            plain = isinstance(self.default, int | float | bool)
            shown = repr(self.default) if plain else json.dumps(self.default, ensure_ascii=False)
            text += f"{indent}// Default: {shown}\n"
        mark = "?" if self.optional else ""
        return f"{text}{indent}{self.name}{mark}: {self.kind.ts(indent)}"


class _Object(_Type):
    def __init__(self, schema: dict[str, Any], schemas: _Schemas | None) -> None:
        super().__init__(schema)
        self.fields: list[_Field] = []
        self.extra: Any = None
        if not schema:
            return
        if "$defs" in schema and schemas:
            schemas.definitions.update(schema["$defs"] or {})
        self.extra = schema.get("additionalProperties")
        if isinstance(self.extra, dict):
            self.extra = _parse(self.extra, schemas)
        if "properties" not in schema:
            return
        required = set(schema.get("required", []))
        for name, prop in schema["properties"].items():
            default = prop.get("default") if isinstance(prop, dict) else None
            kind = _parse(prop, schemas)
            self.fields.append(_Field(name, kind, name not in required, default))

    def ts(self, indent: str = "") -> str:
        inner = indent + _INDENT
        ordered = sorted((f for f in self.fields if not f.optional), key=lambda f: f.name)
        ordered += sorted((f for f in self.fields if f.optional), key=lambda f: f.name)
        parts = [f.ts(inner) for f in ordered]
        if self.extra is not None:
            if self.extra is True:
                extra = "any"
            elif self.extra is False:
                extra = "never"
            elif isinstance(self.extra, _Type):
                extra = self.extra.ts(inner)
            else:
                raise ValueError(f"Unknown additionalProperties: {self.extra}")
            parts.append(f"{inner}[k: string]: {extra}")
        if not parts:
            return "{}"
        return "{\n" + ",\n".join(parts) + f"\n{indent}}}"


class _Array(_Type):
    def __init__(self, schema: dict[str, Any], schemas: _Schemas | None) -> None:
        super().__init__(schema, ("minItems", "maxItems"))
        items = schema.get("items")
        self.item: _Type = _parse(items, schemas) if items else _Scalar("any")

    def ts(self, indent: str = "") -> str:
        inner = indent + _INDENT
        doc = self.item.doc(inner)
        if not doc:
            return f"Array<{self.item.ts(indent)}>"
        return f"Array<\n{doc}{inner}{self.item.ts(inner)}\n{indent}>"


class _Enum(_Type):
    _CHECKS: dict[str, Any] = {  # noqa: RUF012
        "string": str,
        "number": (int, float),
        "integer": int,
        "boolean": bool,
    }

    def __init__(self, schema: dict[str, Any]) -> None:
        super().__init__(schema)
        self.values = schema["enum"]
        if "type" not in schema:
            return
        kind = schema["type"]
        if isinstance(kind, list):
            if len(kind) == 1:
                kind = kind[0]
            elif len(kind) == 2 and "null" in kind:
                kind = kind[0] if kind[0] != "null" else kind[1]
            else:
                raise ValueError(f"Enum type {kind} is not supported")
        check = self._CHECKS.get(kind)
        for value in self.values:
            if value is not None and check is not None and not isinstance(value, check):
                raise ValueError(f"Enum value {value} is not a {kind}")

    def ts(self, indent: str = "") -> str:
        return " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in self.values)


class _AnyOf(_Type):
    def __init__(self, schema: dict[str, Any], schemas: _Schemas | None) -> None:
        super().__init__(schema)
        self.options = [_parse(option, schemas) for option in schema["anyOf"]]

    def ts(self, indent: str = "") -> str:
        return " | ".join(option.ts(indent) for option in self.options)


class _Union(_Type):
    def __init__(self, schema: dict[str, Any]) -> None:
        super().__init__(schema)
        self.names = [_UNION_NAMES[kind] for kind in schema["type"]]

    def ts(self, indent: str = "") -> str:
        return " | ".join(self.names)


class _Ref(_Type):
    def __init__(self, schema: dict[str, Any], schemas: _Schemas) -> None:
        super().__init__(schema)
        ref = schema["$ref"]
        resolved = schemas.resolve(ref)
        self.name = "parameters" if resolved.get("$self_ref") else ref.split("/")[-1]

    def ts(self, indent: str = "") -> str:
        return str(self.name)


def _parse(schema: Any, schemas: _Schemas | None = None) -> _Type:
    if isinstance(schema, bool):  # true: anything; false: nothing (shown as null)
        return _Scalar("any" if schema else "null")
    if "$ref" in schema and schemas:
        return _Ref(schema, schemas)
    if "anyOf" in schema:
        return _AnyOf(schema, schemas)
    if "enum" in schema:
        return _Enum(schema)
    if "type" in schema:
        kind = schema["type"]
        if isinstance(kind, list):
            return _Union(schema)
        if kind == "object":
            return _Object(schema, schemas)
        if kind == "array":
            return _Array(schema, schemas)
        return _Scalar(kind, schema)
    if schema == {}:
        return _Scalar("any")
    raise ValueError(f"Invalid JSON Schema object: {schema}")


def _function_ts(function: dict[str, Any]) -> str:
    schemas = _Schemas()
    root = _Object(function.get("parameters") or {}, schemas)
    interfaces = []
    if schemas.self_ref:  # the parameters refer to themselves: name them
        body = ",\n".join(f.ts(_INDENT) for f in root.fields)
        body = f"\n{body}\n" if body else ""
        interfaces.append(f"interface parameters {{{body}}}")
    for name, schema in dict(schemas.definitions).items():
        described = schema.get("description", "")
        head = _comment(described) + "\n" if described else ""
        interfaces.append(f"{head}interface {name} {_parse(schema, schemas).ts()}")
    argument = "parameters" if schemas.self_ref else root.ts()
    description = function.get("description")
    parts = [
        "\n".join(interfaces),
        (description and _comment(description)) or "",
        f"type {function.get('name', 'function')} = (_: {argument}) => any;",
    ]
    return "\n".join(part for part in parts if part)


def encode_tools_to_typescript_style(tools: list[dict[str, Any]]) -> str:
    """`# Tools` and a `namespace functions` of the OpenAI function tools; "" when none."""
    functions = [
        _function_ts(tool["function"])
        for tool in tools or []
        if tool.get("type") == "function" and tool.get("function")
    ]
    if not functions:
        return ""
    return "# Tools\n\n## functions\nnamespace functions {\n" + "\n".join(functions) + "\n}\n"


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
