"""Size limits of the code, so a module keeps one concern and a class one job: a module at most
450 lines, a class at most 250 (the limits the generate redesign set)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("streams", "producers", "sinks", "compose")
MODULE_LINES = 450
CLASS_LINES = 250


def modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def oversized(path: Path, root: Path = ROOT) -> list[str]:
    text = path.read_text()
    name = str(path.relative_to(root))
    found = []
    if (lines := len(text.splitlines())) > MODULE_LINES:
        found.append(f"{name}: {lines} lines")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > CLASS_LINES:
                found.append(f"{name}: class {node.name} {length} lines")
    return found


def test_modules_and_classes_stay_within_their_limits() -> None:
    assert len(modules()) > 100  # the packages are where this looks
    assert [line for path in modules() for line in oversized(path)] == []


def test_the_check_sees_a_long_module_and_a_long_class(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(CLASS_LINES))
    path = tmp_path / "probe.py"
    path.write_text(f"class Big:\n{body}\n" + "\n" * (MODULE_LINES - CLASS_LINES))
    assert oversized(path, tmp_path) == [
        f"probe.py: {MODULE_LINES + 1} lines",
        f"probe.py: class Big {CLASS_LINES + 1} lines",
    ]
    fits = body.rsplit("\n", 1)[0]  # a line less: the class statement and 249 more
    path.write_text(f"class Fits:\n{fits}\n")
    assert oversized(path, tmp_path) == []
