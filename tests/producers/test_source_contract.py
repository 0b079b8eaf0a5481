"""What every registered source format must be, checked over whatever `SOURCE_FORMATS` holds:
a format added in one module and one registration is covered without editing a test."""

from __future__ import annotations

import pytest

from producers.sources import SOURCE_FORMATS, SourceFormat
from producers.sources import _format_of as format_of
from streams.cli.main import build_parser


@pytest.fixture(params=sorted(SOURCE_FORMATS))
def named(request: pytest.FixtureRequest) -> tuple[str, SourceFormat]:
    return request.param, SOURCE_FORMATS[request.param]


def test_its_endings_are_lowercase_suffixes_no_other_format_claims(
    named: tuple[str, SourceFormat],
) -> None:
    name, fmt = named
    assert fmt.extensions, name
    others = {e for n, f in SOURCE_FORMATS.items() if n != name for e in f.extensions}
    for ending in fmt.extensions:
        assert ending.startswith(".") and ending == ending.lower(), ending
        assert ending not in others, f"{ending} is claimed by two formats"


def test_publish_offers_it_and_each_of_its_files_goes_to_it(
    named: tuple[str, SourceFormat],
) -> None:
    name, fmt = named
    parser = build_parser(["publish"])
    command = next(a for a in parser._actions if a.dest == "command")
    publish = command.choices["publish"]  # type: ignore[index]
    sources_help = next(a.help for a in publish._actions if a.dest == "sources") or ""
    assert fmt.extensions[0] in sources_help, f"publish --help does not name {name}"
    for ending in fmt.extensions:
        for compressed in ("", ".gz", ".zst"):
            assert format_of(f"data/rows{ending.upper()}{compressed}") is fmt, ending
