"""docs/architecture.md's layer table is the one the import test enforces (``LAYERS``): the
same units, in the same layers, bottom first. A layer changed in the code and not in the
page (or the other way round) fails here, naming the row."""

from __future__ import annotations

import re

from test_import_direction import LAYERS, package_graph
from test_readme import ARCHITECTURE, section, table_rows

from support import REPO

_UNIT = re.compile(r"`(simpipe(?:\.[a-z_]+)*)`")


def documented_layers(text: str) -> list[tuple[str, ...]]:
    """Each row's units: the ``simpipe...`` names in its second column, in order."""
    return [tuple(_UNIT.findall(cells[1])) for cells in table_rows(section(text, "Layers"))]


def layer_problems(documented: list[tuple[str, ...]],
                   enforced: list[tuple[str, ...]]) -> list[str]:
    problems = []
    if len(documented) != len(enforced):
        problems.append(f"the page has {len(documented)} layers, LAYERS {len(enforced)}")
    for i, (doc, code) in enumerate(zip(documented, enforced, strict=False), start=1):
        if set(doc) != set(code):
            problems.append(f"layer {i}: the page names {sorted(doc)}, LAYERS {sorted(code)}")
    return problems


def test_the_page_draws_the_layers_the_import_test_enforces():
    problems = layer_problems(documented_layers(ARCHITECTURE.read_text(encoding="utf-8")),
                              LAYERS)
    assert not problems, "docs/architecture.md '## Layers':\n" + "\n".join(problems)


def test_a_unit_in_the_wrong_layer_is_caught():
    page = ("## Layers\n\n| layer | units | may import |\n|---|---|---|\n"
            "| base | `simpipe.core.errors` | nothing |\n"
            "| top | `simpipe.cli`, `simpipe` | all |\n")
    same = [("simpipe.core.errors",), ("simpipe", "simpipe.cli")]
    assert layer_problems(documented_layers(page), same) == []
    moved = layer_problems(documented_layers(page), [("simpipe.core.errors", "simpipe.cli"),
                                                     ("simpipe",)])
    assert moved == ["layer 1: the page names ['simpipe.core.errors'], LAYERS "
                     "['simpipe.cli', 'simpipe.core.errors']",
                     "layer 2: the page names ['simpipe', 'simpipe.cli'], LAYERS ['simpipe']"]


def layers_picture(graph: dict[str, dict[str, list[str]]]) -> str:
    """The picture under "## Layers": each unit an arrow to the units it imports, drawn from
    the import graph without the arrows a path through other arrows already implies (its
    transitive reduction), so that it stays readable. Mermaid, which GitHub renders."""
    edges = {unit: set(targets) for unit, targets in graph.items()}

    def below(unit: str) -> set[str]:
        seen: set[str] = set()
        todo = list(edges.get(unit, ()))
        while todo:
            target = todo.pop()
            if target not in seen:
                seen.add(target)
                todo += edges.get(target, ())
        return seen

    def node(unit: str) -> str:  # Mermaid ids take no dots: simpipe.run -> run
        return unit.rpartition(".")[2]

    lines = ["flowchart TB"] + [f'  {node(unit)}["{unit}"]' for unit in sorted(edges)]
    for unit in sorted(edges):
        direct = edges[unit]
        kept = [t for t in sorted(direct) if not any(t in below(o) for o in direct if o != t)]
        lines += [f"  {node(unit)} --> {node(target)}" for target in kept]
    return "\n".join(lines)


_MERMAID = re.compile(r"```mermaid\n(.*?)\n```", re.S)


def test_the_picture_is_drawn_from_the_imports():
    found = _MERMAID.search(section(ARCHITECTURE.read_text(encoding="utf-8"), "Layers"))
    expected = layers_picture(package_graph(REPO))
    assert found and found.group(1) == expected, (
        "docs/architecture.md '## Layers': the picture differs from the imports; paste:\n"
        f"```mermaid\n{expected}\n```")


def test_the_picture_leaves_out_arrows_a_path_implies():
    graph = {"s.top": {"s.mid": [], "s.low": []}, "s.mid": {"s.low": []}, "s.low": {}}
    assert layers_picture(graph).splitlines() == [
        "flowchart TB", '  low["s.low"]', '  mid["s.mid"]', '  top["s.top"]',
        "  mid --> low", "  top --> mid"]
