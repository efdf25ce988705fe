"""Every relative link in README.md and docs/*.md points to a file that exists, and every
``#anchor`` to a heading that exists (the anchor GitHub gives it)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target); the text may hold `code` and nested [brackets].
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = ("http://", "https://", "mailto:")


def documentation_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code removed."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, _INLINE_CODE.sub("", line)))
    return out


def markdown_links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link and image outside code."""
    return [(number, m.group(1)) for number, line in _prose_lines(text)
            for m in _LINK.finditer(line)]


def heading_slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline markup dropped, lower case, punctuation other
    than ``-`` and ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def heading_anchors(text: str) -> set[str]:
    """Every anchor of a document; a repeated slug gets ``-1``, ``-2``... as on GitHub."""
    seen: Counter[str] = Counter()
    anchors = set()
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if m is None:
            continue
        slug = heading_slug(m.group(2))
        anchors.add(slug if seen[slug] == 0 else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return anchors


def broken_links(files: list[Path], root: Path) -> list[str]:
    """One line per link that points nowhere: ``file:line: target: why``."""
    problems = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        for number, target in markdown_links(text):
            if target.startswith(_EXTERNAL):
                continue
            where = f"{path.relative_to(root)}:{number}: {target}"
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                problems.append(f"{where}: no such file {linked.relative_to(root)}")
                continue
            if anchor and linked.suffix == ".md":
                if anchor not in heading_anchors(linked.read_text(encoding="utf-8")):
                    problems.append(f"{where}: no heading with anchor #{anchor} in "
                                    f"{linked.relative_to(root)}")
    return problems


def test_every_relative_link_in_readme_and_docs_resolves():
    problems = broken_links(documentation_files(), ROOT)
    assert not problems, "links that point nowhere:\n" + "\n".join(problems)


def test_the_readme_links_every_docs_page():
    # A page nobody links to is a page nobody finds.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {target.partition("#")[0] for _, target in markdown_links(readme)}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md"))
                if f"docs/{p.name}" not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_a_missing_file_a_missing_anchor_and_code_are_told_apart(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "# Page\n\n## Set up (fresh machine, Python 3.11+)\n\n## `[agents]`\n\n## Notes\n\n"
        "## Notes\n\n```\n## not a heading\n```\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "See [the page](docs/page.md), [set up](docs/page.md#set-up-fresh-machine-python-311),\n"
        "[agents](docs/page.md#agents), [notes again](docs/page.md#notes-1),\n"
        "[gone](docs/missing.md) and [no such part](docs/page.md#nowhere),\n"
        "[here](#readme-part), ![picture](docs/shot.png) and [web](https://example.org/x).\n"
        "`[in code](docs/also-missing.md)` and\n```\n[in a block](docs/also-missing.md)\n```\n"
        "[fenced](docs/page.md#not-a-heading)\n\n## README part\n", encoding="utf-8")
    problems = broken_links(documentation_files(tmp_path), tmp_path)
    assert problems == [
        "README.md:3: docs/missing.md: no such file docs/missing.md",
        "README.md:3: docs/page.md#nowhere: no heading with anchor #nowhere in docs/page.md",
        "README.md:4: docs/shot.png: no such file docs/shot.png",
        "README.md:9: docs/page.md#not-a-heading: no heading with anchor #not-a-heading in "
        "docs/page.md",
    ]
