"""The repository is self-contained: no file points outside it, and every relative link of its
Markdown pages leads to a file (and heading) that exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# where the design and its notes lived before docs/design.md: outside a clone
OUTSIDE = re.compile(
    rb"\.\./shared|\.\./DESIGN|shared/DESIGN|/work/shared"
    rb"|notes/(?:model-templates|sglang-api|kafka-faust)\.md"
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# the code block under "## The two commands" in README.md
README_BLOCK = re.compile(r"^## The two commands\n.*?^```bash\n(.*?)^```", re.DOTALL | re.MULTILINE)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
SKIPPED_DIRS = {".git", ".venv", "node_modules", "__pycache__", "runs"}


def tracked_files() -> list[Path]:
    """The files git tracks; outside a git checkout, every file but the usual build dirs."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        names = [name for name in listed.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        names = [
            str(path.relative_to(ROOT))
            for path in ROOT.rglob("*")
            if path.is_file()
            and not SKIPPED_DIRS & set(path.relative_to(ROOT).parts)
            and not path.relative_to(ROOT).parts[0].endswith(".egg-info")
        ]
    return [ROOT / name for name in names if (ROOT / name).is_file()]


def markdown_pages() -> list[Path]:
    return [path for path in tracked_files() if path.suffix == ".md"]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.MULTILINE)}


def test_no_tracked_file_points_outside_the_repository() -> None:
    this = Path(__file__).resolve()
    found = [
        f"{path.relative_to(ROOT)}: {match.group().decode()}"
        for path in tracked_files()
        if path.resolve() != this
        for match in OUTSIDE.finditer(path.read_bytes())
    ]
    assert found == []


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_of_a_page_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, …
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        missing = not linked.is_relative_to(ROOT) or not linked.exists()
        if missing or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
            broken.append(target)
    assert broken == []


def test_the_checks_see_a_link_outside_and_a_broken_one(tmp_path: Path) -> None:
    assert OUTSIDE.search(b"the contract is in `../shared/DESIGN.md`")
    assert OUTSIDE.search(b"see ../DESIGN.md")
    assert not OUTSIDE.search(b"docs/design.md; --dataset ../evil is refused")
    assert LINK.findall("[a](docs/x.md#b) and ![p](img.png) but not [c] (d)") == [
        "docs/x.md#b",
        "img.png",
    ]
    assert slug("Where a run stands: `draftgen status` and metrics") == (
        "where-a-run-stands-draftgen-status-and-metrics"
    )


def test_ci_runs_the_readmes_test_command() -> None:
    """CI (`.ci/run`) runs the test command of the README's "The two commands" block, as written
    there: if either changes alone, they have drifted apart."""
    block = README_BLOCK.search((ROOT / "README.md").read_text())
    assert block is not None, "README.md has no 'The two commands' code block"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    test = [c for c in commands if c.endswith(" test") or " test " in f"{c} "]
    ci_lines = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "set ", "cd "))
    ]
    assert test == ["compose/setup.sh test"], test
    assert [line.split("#")[0].strip() for line in ci_lines] == test, ci_lines
    # the README's line itself, its comment included
    assert ci_lines == [line for line in block.group(1).splitlines() if line.startswith(test[0])]


# an absolute path in a text: after a space, quote, backtick, bracket or `=`, or at a line start
ABSOLUTE = re.compile(r"""(?:^|[\s`'"(=\[])(/[A-Za-z0-9._-]+(?:/[^\s`'")\]]*)?)""", re.MULTILINE)
# directories every Unix machine has: a path under them is nobody's in particular
SYSTEM = {"bin", "boot", "dev", "etc", "lib", "lib64", "proc", "run", "sbin", "sys", "tmp", "usr"}


def machine_paths(text: str, root: Path = ROOT) -> list[str]:
    """The absolute paths of a text that are this machine's: under a top-level directory that
    exists here and is not a system one (`/work/…`, `/home/…`, `/root/…`), or inside the
    clone itself by its absolute path."""
    found = []
    for path in ABSOLUTE.findall(text):
        top = path.split("/")[1]
        if path.startswith(str(root)) or (top not in SYSTEM and Path("/", top).exists()):
            found.append(path)
    return found


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_names_a_path_of_this_machine(page: Path) -> None:
    assert machine_paths(page.read_text()) == []


def test_the_path_check_sees_this_machines_paths_and_not_examples(tmp_path: Path) -> None:
    mine = f"run `{ROOT}/compose/setup.sh` or cd {Path.home()}/x"
    assert machine_paths(mine) == [f"{ROOT}/compose/setup.sh", f"{Path.home()}/x"]
    examples = "--to /nowhere-dataset/q36.jsonl; flock /tmp/draftgen-heavy.lock; a/b/c"
    assert machine_paths(examples) == []


# the paths docs/design.md names in backticks: `streams/core/ledger.py`, `sinks/`
DESIGN_PATH = re.compile(r"`((?:streams|producers|sinks|compose|tests|docs)/[\w/.-]*)`")


def test_every_path_design_md_names_exists() -> None:
    named = set(DESIGN_PATH.findall((ROOT / "docs" / "design.md").read_text()))
    assert named, "design.md names no path: the pattern is wrong"
    assert sorted(p for p in named if not (ROOT / p).exists()) == []
