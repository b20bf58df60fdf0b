"""The README is a front page (issue 40, item 5), and what it and docs/ point at exists: every relative link resolves,
and every command the README names runs as written (its script exists, its flags are the CLI's, its profile ships,
its test paths and markers exist)."""
import re
import shlex
from pathlib import Path

import pytest

from infra.cli import parser
from infra.config import PROFILES_DIR, PROJECT_ROOT

PAGES = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def commands(text: str) -> list[list[str]]:
    """Each `python ...` command of the README, as its arguments (comments dropped): the indented code blocks' lines
    (each part of a `&&` chain) and inline code."""
    lines = [part.strip() for line in text.splitlines() if line.startswith("    ") for part in line.split("&&")]
    lines += re.findall(r"`(python [^`]+)`", text)
    return [shlex.split(line, comments=True) for line in lines if line.startswith("python ")]


def test_the_readme_is_a_front_page():
    readme = (PROJECT_ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert readme.count("| cause |") == 1  # one verdict table, in the README only
    assert "| cause |" not in "".join(p.read_text() for p in PAGES[1:])


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        assert (page.parent / target.split("#")[0]).exists(), f"{page.name} links to {target}, which does not exist"


def test_every_command_the_readme_names_is_valid():
    found = commands((PROJECT_ROOT / "README.md").read_text())
    assert len(found) >= 4, found
    for argv in found:
        if argv[1:3] == ["-m", "pytest"]:
            paths = [a for a in argv[3:] if not a.startswith("-") and "e2e" not in a]
            assert all((PROJECT_ROOT / p).exists() for p in paths), argv
            if "-m" in argv[3:]:
                assert "e2e" in (PROJECT_ROOT / "pyproject.toml").read_text()  # the marker it selects on
            continue
        script = PROJECT_ROOT / argv[1]
        assert script.exists(), argv
        if argv[1] == "flows/diagnose.py":
            args = parser().parse_args(argv[2:])  # an unknown flag or a missing value exits here
            if args.profile and not args.profile.endswith((".yaml", ".yml")):
                assert (PROFILES_DIR / f"{args.profile}.yaml").exists(), argv
