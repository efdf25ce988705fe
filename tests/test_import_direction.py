"""The layers import in one direction: the domain packages (``games/``, ``personas/``) never
import the pipeline (``simpipe.*`` outside ``simpipe.games`` and ``simpipe.personas``) or
the cluster, and ``cluster/`` never imports the games or the personas. Checked on the source
with ``ast``, so an import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from simpipe.errors import IMPORTABLE_EVERYWHERE

from support import REPO

DOMAIN = ("simpipe.games", "simpipe.personas")
#: The one pipeline module every package may import: the base of the errors a user can fix
#: (``simpipe.errors`` imports nothing of simpipe itself).
EVERYWHERE = (IMPORTABLE_EVERYWHERE,)


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def imported_names(path: Path, package: str) -> list[tuple[int, str]]:
    """Everything the file imports, as absolute dotted names (``from a import b``: ``a.b``,
    which is the module ``a.b`` or a name inside ``a``; relative imports resolved against
    ``package``, the file's own), with its line, in line order."""
    out = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module) if p)
            out += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return sorted(out)


def violations(root: Path, folder: str) -> list[str]:
    """``file:line imports module`` for each import against the direction."""
    bad = []
    for path in sorted((root / folder).rglob("*.py")):
        package = ".".join(["simpipe", *path.parent.relative_to(root).parts])
        for line, name in imported_names(path, package):
            if folder == "cluster":
                wrong = _within(name, DOMAIN)
            else:
                wrong = (_within(name, ("simpipe",)) and not _within(name, DOMAIN)
                         and not _within(name, EVERYWHERE))
            if wrong:
                bad.append(f"{path.relative_to(root)}:{line} imports {name}")
    return bad


@pytest.mark.parametrize("folder", ["games", "personas", "cluster"])
def test_imports_point_one_way(folder: str) -> None:
    assert any((REPO / folder).glob("*.py"))
    assert violations(REPO, folder) == []


def test_a_wrong_import_is_found_wherever_it_is(tmp_path: Path) -> None:
    (tmp_path / "games").mkdir()
    (tmp_path / "games" / "bad.py").write_text(
        "from . import config\nimport simpipe.personas.sampling\n"
        "from simpipe.errors import SimpipeError\n"
        "def f():\n    from simpipe.run.simulation import run_simulation\n"
        "from .. import cluster\n")
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "bad.py").write_text(
        "from simpipe.config import Config\nfrom simpipe.games import registry\n")
    assert violations(tmp_path, "games") == [
        "games/bad.py:5 imports simpipe.run.simulation.run_simulation",
        "games/bad.py:6 imports simpipe.cluster"]
    assert violations(tmp_path, "cluster") == ["cluster/bad.py:2 imports simpipe.games.registry"]
