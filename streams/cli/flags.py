"""Command-line flags derived from the settings classes (streams/core/settings/).

A field declared with `cli=True` becomes an option spelled as its name (`flag_of`: dashes for
underscores, `--no-` for a bool that defaults to True, the singular for a list given once per
item); its type, choices, range and default come from the field, so a setting is declared in
one place. A setting that names a registry entry (`OneOf`, or a registry the command gives for
a setting the settings cannot see: export's `--format`) offers the entries registered when the
parser is built. Earlier spellings (`aliases`) are still accepted until 0.2, as the help says.
Flags left out on the command line stay unset, so the environment (`DRAFTGEN_…`) and then the
default apply, in that order. A bad value or a missing required setting is one line naming the
flag and its environment variable.
"""

from __future__ import annotations

import argparse
import os
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import orjson
from pydantic import AliasChoices, ConfigDict, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from streams.core.errors import CliError
from streams.core.registry import Registry
from streams.core.settings.base import OneOf

S = TypeVar("S", bound=BaseSettings)
# how pydantic introduces the message of a validator's ValueError
_VALUE_ERROR = "Value error, "


class Adder(Protocol):
    """A parser or an argument group: what options are added to."""

    def add_argument(self, *names: str, **options: Any) -> Any: ...


def _extra(field: FieldInfo) -> dict[str, Any]:
    extra = field.json_schema_extra
    return dict(extra) if isinstance(extra, dict) else {}


def _nested(field: FieldInfo) -> type[BaseSettings] | None:
    """The settings class of a field that holds settings of its own (kafka, sampling, …)."""
    for candidate in (field.annotation, *typing.get_args(field.annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseSettings):
            return candidate
    return None


def _base_type(annotation: Any) -> Any:
    """`int | None` → int: None is what an absent flag means, never a value typed in."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        arms = [a for a in typing.get_args(annotation) if a is not type(None)]
        return arms[0] if len(arms) == 1 else annotation
    return annotation


def _registry(annotation: Any, field: FieldInfo) -> Registry[Any] | None:
    """The registry whose names the setting takes (`Annotated[str, OneOf(...)]`)."""
    metadata = list(field.metadata)
    if typing.get_origin(annotation) is typing.Annotated:
        metadata += typing.get_args(annotation)[1:]
    return next((m.registry for m in metadata if isinstance(m, OneOf)), None)


def _entries_help(registry: Registry[Any]) -> str:
    """`name: its help; …` for a registry whose entries have a `help`."""
    helps = [(name, getattr(entry, "help", None)) for name, entry in registry.items()]
    return "; ".join(f"{name}: {text}" for name, text in helps if text)


def flag_of(name: str, field: FieldInfo) -> str | None:
    """The command-line spelling of a field, None when it has no flag."""
    if not _extra(field).get("cli"):
        return None
    annotation = _base_type(field.annotation)
    if annotation is bool and field.default is True:
        return f"--no-{name.replace('_', '-')}"
    if typing.get_origin(annotation) is list:
        name = name.removesuffix("s")
    return f"--{name.replace('_', '-')}"


def env_names(cls: type[BaseSettings], name: str) -> list[str]:
    field = cls.model_fields[name]
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    if isinstance(alias, str):
        return [alias]
    return [f"{cls.model_config.get('env_prefix', '')}{name}".upper()]


def _converter(flag: str, annotation: Any, field: FieldInfo, cls: type[BaseSettings]) -> Any:
    constrained: Any = annotation
    if field.metadata:
        constrained = typing.Annotated[annotation, *field.metadata]
    # the class's own rules for numbers (no nan, no inf), as when it is built
    config = ConfigDict(allow_inf_nan=cls.model_config.get("allow_inf_nan", True))
    adapter: TypeAdapter[Any] = TypeAdapter(constrained, config=config)

    def convert(text: str) -> Any:
        try:
            return adapter.validate_python(text)
        except ValidationError as err:
            message = str(err.errors()[0]["msg"])
            if message.startswith(_VALUE_ERROR):  # our validators say the value themselves
                raise argparse.ArgumentTypeError(message.removeprefix(_VALUE_ERROR)) from None
            raise argparse.ArgumentTypeError(
                f"{text!r}: {message[0].lower()}{message[1:]}"
            ) from None

    convert.__name__ = flag.lstrip("-")  # argparse names the type in its error message
    return convert


def add_flags(
    parser: Adder,
    cls: type[BaseSettings],
    *,
    only: Iterable[str] | None = None,
    skip: Iterable[str] = (),
    registries: Mapping[str, Registry[Any]] | None = None,
) -> None:
    """Add an option per flagged field of `cls` and of the settings it nests; `only`/`skip`
    select top-level fields by name; `registries` gives the registry of a field whose type
    cannot name it (a registry above streams.core)."""
    chosen = set(only) if only is not None else None
    for name, field in cls.model_fields.items():
        if name in skip or (chosen is not None and name not in chosen):
            continue
        nested = _nested(field)
        if nested is not None:
            add_flags(parser, nested)
            continue
        extra = _extra(field)
        flag = flag_of(name, field)
        if flag is None:
            continue
        help_text = extra.get("help", "")
        annotation = _base_type(field.annotation)
        options: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS}
        if annotation is bool:
            # `--no-x` turns a default-on setting off; `--x` turns a default-off one on
            options.update(action="store_const", const=field.default is not True)
        elif typing.get_origin(annotation) is list:
            options.update(action="append", metavar=name.rstrip("s").upper())
        else:
            registry = (registries or {}).get(name) or _registry(annotation, field)
            if registry is not None:
                options["choices"] = list(registry)
                described = _entries_help(registry)
                help_text = f"{help_text} ({described})" if described else help_text
            elif typing.get_origin(annotation) is Literal:
                choices = list(typing.get_args(annotation))
                options["choices"] = choices
                if all(isinstance(c, str) and c.isupper() for c in choices):
                    options["type"] = str.upper  # INFO or info
            else:
                options["type"] = _converter(flag, annotation, field, cls)
                options["metavar"] = extra.get("metavar", name.upper())
            options.update({k: extra[k] for k in ("nargs", "const") if k in extra})
            shown = not field.is_required() and field.default not in (None, "")
            if shown and "default" not in help_text:
                help_text = f"{help_text} (default {field.default})".lstrip()
        aliases = extra.get("aliases", ())
        if aliases:
            earlier = ", ".join(aliases)
            help_text = f"{help_text} ({earlier}: the earlier spelling, accepted until 0.2)"
        parser.add_argument(flag, *aliases, help=help_text.strip() or None, **options)


def given(
    args: argparse.Namespace, cls: type[BaseSettings], only: Iterable[str] | None = None
) -> dict[str, Any]:
    """The values of `cls` set on the command line, nested settings as dicts; `only` as in
    `add_flags` (flags of the same name may belong to another settings class)."""
    values: dict[str, Any] = {}
    chosen = set(only) if only is not None else None
    for name, field in cls.model_fields.items():
        if chosen is not None and name not in chosen:
            continue
        nested = _nested(field)
        if nested is not None:
            inner = given(args, nested)
            if inner:
                values[name] = inner
        elif flag_of(name, field) and name in vars(args):
            values[name] = getattr(args, name)
    return values


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def construct(cls: type[S], values: dict[str, Any]) -> S:
    """`cls(**values)`, building nested settings through their own constructors so that each
    reads its environment (secrets are never in `values`)."""
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        field = cls.model_fields.get(name)
        nested = _nested(field) if field is not None else None
        kwargs[name] = construct(nested, value) if nested and isinstance(value, dict) else value
    return cls(**kwargs)


def build(
    cls: type[S],
    args: argparse.Namespace | None = None,
    *,
    base: dict[str, Any] | None = None,
    only: Iterable[str] | None = None,
    registries: Mapping[str, Registry[Any]] | None = None,
    **fixed: Any,
) -> S:
    """Settings from, lowest first: defaults, environment, `base` (a settings file), flags,
    `fixed` (what the command decides itself). Invalid or missing values are a CliError;
    `registries` as in `add_flags` (checked here for a value from the environment)."""
    values = _merge(base or {}, given(args, cls, only) if args is not None else {})
    values = _merge(values, fixed)
    try:
        settings = construct(cls, values)
    except ValidationError as err:
        raise CliError(describe(cls, err)) from None
    for name, registry in (registries or {}).items():
        try:
            OneOf(registry).check(getattr(settings, name))
        except ValueError as err:
            environ = {key.upper() for key in os.environ}
            names = env_names(cls, name)
            source = next((env for env in names if env.upper() in environ), None)
            raise CliError(f"{source or flag_of(name, cls.model_fields[name])}: {err}") from None
    return settings


def describe(cls: type[BaseSettings], err: ValidationError) -> str:
    """One line for the first error: the flag (or environment variable) and what is wrong."""
    first = err.errors()[0]
    if not first["loc"]:  # a rule across fields: its message says it all
        return str(first["msg"]).removeprefix("Value error, ")
    owner, name = _locate(cls, [str(part) for part in first["loc"]])
    if owner is None or name is None:
        return f"invalid settings: {first['msg']}"
    flag = flag_of(name, owner.model_fields[name])
    nested = _nested(owner.model_fields[name])
    if first["type"] == "missing" and flag is None and nested is not None:
        # settings of their own (storage) missing as a whole: name the flag that gives them
        required = [n for n, f in nested.model_fields.items() if f.is_required()]
        if required:
            owner, name = nested, required[0]
            flag = flag_of(name, owner.model_fields[name])
    names = env_names(owner, name)
    if first["type"] == "missing":
        if flag == "--bootstrap":  # the one setting the local stack can give
            return f"{flag} is required (or set {names[0]}, or start `draftgen stack up`)"
        return f"{flag} is required (or set {names[0]})" if flag else f"set {names[0]}"
    # A flag's own value was checked as it was parsed: a bad value here is from the
    # environment when a variable of the setting is set, and is named so.
    environ = {key.upper() for key in os.environ}
    source = next((env for env in names if env.upper() in environ), None) or flag or names[0]
    return f"{source}: {str(first['msg']).removeprefix(_VALUE_ERROR)}"


def _locate(
    cls: type[BaseSettings], loc: list[str]
) -> tuple[type[BaseSettings] | None, str | None]:
    """The settings class and field an error is about; a nested default (kafka's settings read
    from the environment) reports its own field names, so those are searched too."""
    for name, field in cls.model_fields.items():
        nested = _nested(field)
        if loc and loc[0] in (name, *env_names(cls, name)):
            if nested is not None and len(loc) > 1:
                return _locate(nested, loc[1:])
            return cls, name
    for field in cls.model_fields.values():
        nested = _nested(field)
        if nested is not None:
            found = _locate(nested, loc)
            if found[0] is not None:
                return found
    return None, None


def add_settings_file_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--settings",
        dest="settings_file",
        type=Path,
        default=None,
        metavar="FILE",
        help="a JSON settings file (what `draftgen run` gives its workers); flags override it",
    )


def settings_file(args: argparse.Namespace) -> dict[str, Any]:
    path: Path | None = getattr(args, "settings_file", None)
    if path is None:
        return {}
    try:
        values = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as err:
        raise CliError(f"--settings {path}: {type(err).__name__}: {err}") from None
    if not isinstance(values, dict):
        raise CliError(f"--settings {path}: not a JSON object")
    return values
