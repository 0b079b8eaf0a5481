"""What every registered model family must do, checked over whatever `FAMILIES` holds: a family
added in one module and one registration is covered here without editing a test.

- its registry key is its profile's name, and `--family NAME` takes it on every stage;
- detection finds it: a template holding its markers, a served model name holding one of its
  model markers, picks it and no earlier family (first registered wins, so a marker another
  family also matches would silently route its models elsewhere);
- its turn format keeps its promises: tool calls it writes are parsed back as written, and its
  think tags are the profile's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streams.cli.main import build_parser
from streams.core.families import FAMILIES, FamilyProfile, detect_family, family_for_model

NAMES = sorted(FAMILIES)


@pytest.fixture(params=NAMES)
def family(request: pytest.FixtureRequest) -> FamilyProfile:
    return FAMILIES[request.param]


def test_its_key_is_its_name_and_every_stage_takes_it(family: FamilyProfile) -> None:
    assert FAMILIES[family.name] is family
    for command in (["worker", "generate"], ["worker", "tokenize"]):
        argv = [*command, "--family", family.name]
        assert build_parser(argv).parse_args(argv).family == family.name


def test_its_template_markers_pick_it_and_no_earlier_family(
    family: FamilyProfile, tmp_path: Path
) -> None:
    if not family.template_markers:
        pytest.skip(f"{family.name} is never detected from a template (the fallback)")
    template = "\n".join(family.template_markers)
    assert detect_family(tmp_path, template=template).name == family.name


def test_its_model_markers_pick_it_and_no_earlier_family(family: FamilyProfile) -> None:
    for marker in family.model_markers:
        assert marker == marker.lower(), f"{family.name}: model markers are lowercase"
        assert family_for_model(f"org/{marker}-instruct").name == family.name, marker


def test_tool_calls_it_writes_are_parsed_back_as_written(family: FamilyProfile) -> None:
    fmt = family.format
    if fmt.tool_start is None:
        assert fmt.parse_calls("no calls here", [], 0) == ("no calls here", [])
        return
    tools = [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
        for name in ("lookup", "run_shell")
    ]
    # string values: a family whose calls carry no types (Qwen's XML) reads them per the schema
    calls = [("lookup", {"q": "weather in Paris"}), ("run_shell", {"command": "ls -la"})]
    written = fmt.write_calls(calls, 0)
    assert written.startswith(fmt.tool_start) or fmt.tool_start in written
    normal, parsed = fmt.parse_calls(written, tools, 0)
    assert normal.strip() == ""
    assert [(call.name, json.loads(call.arguments)) for call in parsed] == calls


def test_its_think_texts_hold_its_think_tags(family: FamilyProfile) -> None:
    opened, closed = family.format.think_texts(family)
    assert family.think_open in opened and family.think_close in closed
