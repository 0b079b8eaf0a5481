"""A registry: the one list of an extension point (model families, export formats, prompt source
formats), by name, in registration order.

Whatever offers a choice reads it from here: the command line's choices and a setting's
accepted values (`OneOf` in streams/core/settings/base.py), error messages, and the docs'
tables (a test compares them). Adding an entry is its module plus one `register` call; a test
adds a toy one for a block only (`registered`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Named entries; the first ones are built in and stay."""

    def __init__(self, kind: str, built_in: Iterable[tuple[str, T]] = ()):
        self.kind = kind  # what an entry is, for messages: "model family"
        self._entries: dict[str, T] = {}
        for name, entry in built_in:
            self.register(name, entry)
        self._built_in = frozenset(self._entries)

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"

    def named(self, name: str) -> T:
        """The entry, or a ValueError that lists the known names."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self._entries)}")
        return self._entries[name]

    def register(self, name: str, entry: T) -> T:
        """Add an entry after the others; its name must be new."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        if name in self._built_in:
            raise ValueError(f"{self.kind} {name!r} is built in")
        self._entries.pop(name, None)

    @contextmanager
    def registered(self, name: str, entry: T) -> Iterator[T]:
        """The entry is known inside the block only (tests)."""
        self.register(name, entry)
        try:
            yield entry
        finally:
            self.unregister(name)
