"""The docs as a reader follows them: every relative link lands on a file of the repository
(and, with `#anchor`, on a heading of it, as GitHub slugs headings), nothing points outside
the repository, and the README stays a short map."""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]
    files += sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "examples").glob("*.md"))
    return [path for path in files if path.is_file()]


FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target); the target up to a space (a title) or the closing ")".
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
UP = re.compile(r"(?<![\w./])(?:\.\./)+[\w./-]*")


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text without markup, lower-cased, with anything
    but letters, digits, marks, `_`, `-` and spaces dropped, and spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    kept = []
    for char in text:
        kind = unicodedata.category(char)
        if char in "-_ " or kind[0] in "LNM":
            kept.append(char)
    return "".join(kept).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    return anchors_of(read(path))


def anchors_of(text: str) -> frozenset[str]:
    """Every anchor GitHub gives the headings, the repeats numbered `-1`, `-2`, ..."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(text):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link outside code."""
    found = []
    for number, line in prose_lines(text):
        for match in LINK.finditer(CODE_SPAN.sub("", line)):
            found.append((number, match.group(1)))
    return found


def inside(path: Path) -> bool:
    return path.resolve().is_relative_to(ROOT)


def broken_links(path: Path, text: str | None = None) -> list[str]:
    problems = []
    where = path.relative_to(ROOT)
    text = read(path) if text is None else text
    for number, target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        if not file_part:
            if anchor not in anchors_of(text):
                problems.append(f"{where}:{number}: {target}: no heading #{anchor} here")
            continue
        dest = path.parent / file_part
        if not inside(dest):
            problems.append(f"{where}:{number}: {target} leaves the repository")
        elif not dest.exists():
            problems.append(f"{where}:{number}: {target}: no such file")
        elif anchor and dest.is_file() and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}:{number}: {target}: no heading #{anchor} in {file_part}")
    return problems


def outside_paths(path: Path, text: str | None = None) -> list[str]:
    """Paths written in the text (links, code, prose) that climb out of the repository,
    and any mention of notes kept beside it."""
    problems = []
    where = path.relative_to(ROOT)
    for number, line in enumerate((read(path) if text is None else text).splitlines(), 1):
        if "shared/notes" in line:
            problems.append(f"{where}:{number}: mentions shared/notes, outside the repository")
        for match in UP.finditer(line):
            if not inside(path.parent / match.group(0)):
                problems.append(f"{where}:{number}: {match.group(0)} leaves the repository")
    return problems


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_points_outside_the_repository(path):
    assert outside_paths(path) == []


def test_the_readme_is_a_short_map():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_the_checker_catches_what_it_should():
    """The checks themselves: a missing file, a missing heading, a climb out of the root;
    web links, links in code and a good anchor in another page pass."""
    page = ROOT / "docs" / "_probe_never_written.md"
    assert slug("`reinforge diff`: what did it learn") == "reinforge-diff-what-did-it-learn"
    assert slug("Rubrics: Reward, GroupReward, Override") == "rubrics-reward-groupreward-override"
    assert slug("A deployment on paper: Qwen3-8B on 64 GPUs") == (
        "a-deployment-on-paper-qwen3-8b-on-64-gpus"
    )
    assert broken_links(page, PROBE) == [
        "docs/_probe_never_written.md:3: no-such.md: no such file",
        "docs/_probe_never_written.md:3: #nowhere: no heading #nowhere here",
        "docs/_probe_never_written.md:3: ../../x.md leaves the repository",
    ]
    assert outside_paths(page, PROBE) == [
        "docs/_probe_never_written.md:3: ../../x.md leaves the repository",
        "docs/_probe_never_written.md:4: mentions shared/notes, outside the repository",
    ]


PROBE = """# Probe

[gone](no-such.md) [here](#nowhere) [up](../../x.md) [fine](config.md#run)
[web](https://example.com/a) `[code](not-a-link.md)` see shared/notes/x.

```
[in a fence](not-checked.md)
```
"""
