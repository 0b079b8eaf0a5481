"""What K2.5/K2.6's tool_declaration_ts.py renders, re-implemented to render the same text: the
tools as TypeScript-style declarations for the chat template's `tools_ts_str` variable.

Shipped as remote code beside tokenization_kimi.py, which imports it (as the real repository's
tokenization_kimi.py imports its tool_declaration_ts.py).
"""

from __future__ import annotations

import json
from typing import Any

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
