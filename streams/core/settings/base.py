"""How a setting is declared, and the validated types settings share.

A field's command-line flag is its name with dashes (`--idle-flush-s`); a bool that defaults
to True is turned off by `--no-<name>`, and a list is given once per item by the singular
(`sources` ← `--source`). Its environment name is `DRAFTGEN_<NAME>` (the class's prefix) unless
`env=` says otherwise: a field that means different things in two classes gets a name of its
own in each, so that no variable sets two settings.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    Field,
    GetCoreSchemaHandler,
    SecretStr,
)
from pydantic_core import CoreSchema, core_schema
from pydantic_settings import BaseSettings, SettingsConfigDict

from streams.core.registry import Registry

# Names that become paths, topics, consumer groups or member ids: Kafka's topic alphabet, a
# letter or digit first (so never "." or ".."), short enough for every use.
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_SAFE_PREFIX = re.compile(r"[A-Za-z0-9._-]{0,100}")
_ALPHABET = "letters, digits, '.', '_' and '-'"


def _safe_name(value: str) -> str:
    if not _SAFE_NAME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a safe name: use 1-100 of {_ALPHABET}, starting with a letter "
            "or digit"
        )
    return value


def _safe_prefix(value: str) -> str:
    if not _SAFE_PREFIX.fullmatch(value):
        raise ValueError(f"{value!r} is not a safe prefix: use at most 100 of {_ALPHABET}")
    return value


# an instance id, a group: used in paths, group and member ids
SafeName = Annotated[str, AfterValidator(_safe_name)]
# a dataset version: a directory under the output root and part of a consumer group's name,
# so the same rule wherever one is named (`seal --dataset ../evil` is refused like `worker`'s)
DatasetName = SafeName
# the topic and group prefix (may be empty)
SafePrefix = Annotated[str, AfterValidator(_safe_prefix)]

_HOST_PORT = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(?P<port>[0-9]{1,5})")


def _bootstrap(value: str) -> str:
    """host:port[,host:port]: checked here, as aiokafka fails on it with a traceback."""
    for server in value.split(","):
        found = _HOST_PORT.fullmatch(server.strip())
        if found is None or not 1 <= int(found["port"]) <= 65535:
            raise ValueError(
                f"{value!r} is not a list of servers: use host:port[,host:port], ports 1-65535"
            )
    return value


def _server_url(value: str) -> str:
    """An http(s) base URL with a host: anything else would be retried as a server that is
    down, forever."""
    try:
        url = urlsplit(value.strip())
        port_ok = url.port is None or url.port > 0  # .port raises on a bad one
    except ValueError:
        port_ok = False
    if not port_ok or url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"{value!r} is not a server URL: use http://host[:port] or https://…")
    return value.strip()


# what fsspec may write shards to; anything else fails late, or (memory://) loses them
_OUT_SCHEMES = ("file", "s3", "s3a")


def _output_root(value: str) -> str:
    scheme = value.partition("://")[0].lower() if "://" in value else None
    if not value.strip() or (scheme is not None and scheme not in _OUT_SCHEMES):
        raise ValueError(
            f"{value!r} is not an output root: use a local path, file://… or s3://bucket/prefix"
        )
    return value


def _tokenizer_dir(value: str) -> str:
    """A directory path; whether it holds a tokenizer is checked where it is loaded
    (streams/core/tokenizers.py), which says what is missing."""
    if not value.strip():
        raise ValueError("an empty path is not a tokenizer directory")
    return value


def _concurrency(value: object) -> object:
    """A positive integer, or "auto" (the server's max_running_requests, read at start)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        if text.isdigit():
            value = int(text)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ValueError(f"{value!r} is not a concurrency: use a positive integer or 'auto'")


class OneOf:
    """A setting whose value names an entry of a registry (streams/core/registry.py), as
    `Annotated[str, OneOf(registry)]`: it accepts the names registered when a value is read,
    and its flag offers those registered when the command line is built (streams/cli/flags.py),
    so an entry registered at run time (a test's toy) is accepted like a built-in one."""

    def __init__(self, registry: Registry[Any]):
        self.registry = registry

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def check(self, value: str) -> str:
        if value not in self.registry:
            names = ", ".join(self.registry)
            raise ValueError(f"{value!r} is not a known {self.registry.kind}: use one of {names}")
        return value


Bootstrap = Annotated[str, AfterValidator(_bootstrap)]
ServerUrl = Annotated[str, AfterValidator(_server_url)]
OutputRoot = Annotated[str, AfterValidator(_output_root)]
TokenizerDir = Annotated[str, AfterValidator(_tokenizer_dir)]
Concurrency = Annotated[int | Literal["auto"], BeforeValidator(_concurrency)]


def setting(
    default: Any = ...,
    *,
    cli: bool = False,
    help: str | None = None,
    aliases: tuple[str, ...] = (),
    env: tuple[str, ...] = (),
    default_factory: Any = None,
    nargs: str | None = None,
    const: Any = None,
    metavar: str | None = None,
    **constraints: Any,
) -> Any:
    """A settings field; `cli`: it has a command-line flag (see the module's docstring).
    `aliases` are earlier spellings of the flag, still accepted; `env` its environment names
    when they differ from `DRAFTGEN_<FIELD>`."""
    extra: dict[str, Any] = {"cli": True} if cli else {}
    options = {"help": help, "nargs": nargs, "const": const, "metavar": metavar}
    extra |= {k: v for k, v in options.items() if v is not None}
    if aliases:
        extra["aliases"] = list(aliases)
    if env:
        constraints["validation_alias"] = AliasChoices(*env)
    if default_factory is not None:
        return Field(default_factory=default_factory, json_schema_extra=extra, **constraints)
    return Field(default, json_schema_extra=extra, **constraints)


def dataset_setting(**kwargs: Any) -> Any:
    """The dataset version a command works on: one type, one help, one environment name."""
    return setting(cli=True, help="dataset version name", env=("DRAFTGEN_DATASET",), **kwargs)


class Settings(BaseSettings):
    """Base of every settings class: `DRAFTGEN_` environment names, immutable, strict keys."""

    model_config = SettingsConfigDict(
        env_prefix="DRAFTGEN_",
        frozen=True,
        extra="forbid",
        populate_by_name=True,
        # An empty variable means "not set", as in the rest of the shell world.
        env_ignore_empty=True,
        # nan compares false with every bound and inf passes `gt=0`: neither is a setting
        # (an --idle-flush-s of nan never flushed)
        allow_inf_nan=False,
    )


def secrets_removed(settings: BaseModel) -> dict[str, Any]:
    """The settings as JSON-able values without their secrets (a child reads those from its
    environment, as its parent did)."""
    values: dict[str, Any] = {}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if isinstance(value, SecretStr):
            continue
        values[name] = secrets_removed(value) if isinstance(value, BaseModel) else value
    return values


def default_state_dir() -> Path:
    """Where draftgen keeps what outlives a process on this host (the kept stack, crash notes,
    member slots): `$XDG_STATE_HOME/draftgen`, else `~/.local/state/draftgen`."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "draftgen"
