"""The docs name registered things by hand only where a page documents each of them (a
normalization profile's row in templates.md: a profile registered or removed fails here until
its row matches); elsewhere they point at `--help`, which the registries write, and a list
written by hand fails here. (The export formats' table in docs/data.md is checked in
tests/streams/cli/test_export.py.)"""

from __future__ import annotations

import re
from pathlib import Path

from streams.core.families import FAMILIES
from streams.core.serving import PROFILES
from streams.tools.export_formats import EXPORT_FORMATS

DOCS = Path(__file__).resolve().parent.parent / "docs"
README = DOCS.parent / "README.md"


def test_the_flag_rows_of_families_and_profiles_point_at_help_not_a_list() -> None:
    """Their choices are the registries' (`--help`): a list written here would go stale."""
    text = (DOCS / "configuration.md").read_text()
    for flag, names in (("--family", FAMILIES), ("--normalization", PROFILES)):
        row = re.search(rf"^\| `{flag} ([^`]+)` \|.*$", text, re.MULTILINE)
        assert row is not None and "--help" in row.group(0), flag
        assert not any(name in row.group(0) for name in names if name != "generic"), flag


def test_every_normalization_profile_has_its_row_and_every_row_a_profile() -> None:
    text = (DOCS / "templates.md").read_text()
    rows = re.findall(r"^\| `((?:sglang|vllm)-[\d.]+)` \|", text, re.MULTILINE)
    assert sorted(rows) == sorted(PROFILES)


def test_the_readme_lists_no_export_formats_by_hand() -> None:
    """It points at `export --help`, which the registry writes."""
    text = README.read_text()
    listed = re.findall(r"--format ([\w|]+)", text)
    assert all("|" not in names for names in listed), listed
    assert not any(f"{a}|{b}" in text for a in EXPORT_FORMATS for b in EXPORT_FORMATS if a != b)
