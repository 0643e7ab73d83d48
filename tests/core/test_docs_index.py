"""The README and docs/ hold together: a short README, every page indexed, no broken link.

Issue 30 asks for a README of at most 200 lines and every docs page reachable from its index;
a page moved or renamed must not leave a link pointing at nothing. Links are checked as
GitHub renders them: a relative target is a path from the linking file's folder, and an
``#anchor`` into a Markdown file must be one of its headings' slugs or an explicit
``<a id="...">``. Fenced code blocks are not Markdown and are skipped.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).parents[2]
README_MAX_LINES = 200
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
_EXPLICIT = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def prose(text: str) -> str:
    """The Markdown outside fenced code blocks (a fence's lines become empty)."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a Markdown file offers: heading slugs (repeats get -1, -2, ...) and ids."""
    seen: Counter[str] = Counter()
    out = set(_EXPLICIT.findall(text))
    for heading in _HEADING.findall(prose(text)):
        base = slug(heading)
        out.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
        seen[base] += 1
    return out


def link_problems(root: Path, files: list[Path]) -> list[str]:
    """'file:line: target' for each relative link of ``files`` that resolves to nothing."""
    problems = []
    for path in files:
        text = prose(path.read_text())
        for m in _LINK.finditer(text):
            target = m.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = path if not file_part else (path.parent / file_part).resolve()
            where = f"{path.relative_to(root)}:{text.count(chr(10), 0, m.start()) + 1}"
            if not dest.exists():
                problems.append(f"{where}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                problems.append(f"{where}: {target} (no such anchor)")
    return problems


def unindexed(docs: Path) -> list[str]:
    """The docs/*.md pages that docs/index.md does not link to."""
    index = docs / "index.md"
    linked = {
        (docs / t.partition("#")[0]).resolve()
        for t in _LINK.findall(prose(index.read_text()))
        if t.partition("#")[0]
    }
    return sorted(p.name for p in docs.glob("*.md") if p != index and p.resolve() not in linked)


def test_the_readme_is_at_most_200_lines() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_every_docs_page_is_linked_from_the_index() -> None:
    assert unindexed(ROOT / "docs") == []


def test_the_readme_links_the_index() -> None:
    assert "docs/index.md" in _LINK.findall((ROOT / "README.md").read_text())


def test_every_relative_link_resolves() -> None:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert link_problems(ROOT, files) == []


def test_the_checks_catch_what_they_should(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md) [gone](docs/missing.md)\n"
        "[anchor](docs/a.md#first-part) [bad anchor](docs/a.md#nowhere)\n"
        "```\n[in code](docs/not-checked.md)\n```\n"
        "[web](https://example.com/x.md) [self](#top)\n"
    )
    (docs / "a.md").write_text('# Top\n\n## First part\n\n<a id="top"></a>\n')
    (docs / "b.md").write_text("# B\n")
    (docs / "index.md").write_text("- [a.md](a.md)\n")
    problems = link_problems(tmp_path, [tmp_path / "README.md", docs / "a.md"])
    assert problems == [
        "README.md:1: docs/missing.md (no such file)",
        "README.md:2: docs/a.md#nowhere (no such anchor)",
        "README.md:6: #top (no such anchor)",  # README.md itself has no heading "top"
    ]
    assert unindexed(docs) == ["b.md"]


def test_slugs_as_github_writes_them() -> None:
    # "Before a long run: `--preflight`" -> colon and backticks dropped, 3 spaces -> "-" each:
    # "before a long run --preflight" -> "before-a-long-run---preflight"
    assert slug("Before a long run: `--preflight`") == "before-a-long-run---preflight"
    assert slug("One GPU, measured on an H200") == "one-gpu-measured-on-an-h200"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}
