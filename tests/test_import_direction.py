"""The layers import in one direction: the domain packages (``games/``, ``personas/``) never
import the pipeline (``simpipe.*`` outside ``simpipe.games`` and ``simpipe.personas``) or
the cluster, and ``cluster/`` never imports the games or the personas; every package imports
only its own layer and those below (``LAYERS``), and neither the packages nor the modules
import each other in a cycle. Checked on the source with ``ast``: every import counts, at
the top of a module, inside a function or under ``TYPE_CHECKING`` (an import moved into a
function hides a cycle, it does not break it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from simpipe.core.errors import IMPORTABLE_EVERYWHERE

from support import REPO

DOMAIN = ("simpipe.games", "simpipe.personas")
#: The source folders and the package each one installs as (pyproject's package-dir).
FOLDERS = {"pipeline": "simpipe", "games": "simpipe.games", "personas": "simpipe.personas",
           "cluster": "simpipe.cluster"}
#: The layers, bottom first: a package may import its own layer and those below, never one
#: above. A unit is a subpackage of simpipe (each folder is one layer: ``pipeline/`` itself
#: holds only the lazy API, ``test_each_folder_is_one_unit``). docs/architecture.md
#: explains each layer.
LAYERS: list[tuple[str, ...]] = [
    ("simpipe.core",),  # errors, files, bounded reads, event loop, seeds: nothing of simpipe
    ("simpipe.games", "simpipe.personas"),  # the domain: pure Python
    ("simpipe.inference",),  # the client side of inference
    ("simpipe.servers",),  # the servers simpipe runs (llama.cpp's uses the engine)
    ("simpipe.cluster",),  # workers, server jobs, persistent clusters
    ("simpipe.config",),  # the config, composed from the sections of the layers below
    ("simpipe.store",),  # a run's files (run.json records the config)
    # how answers are obtained from a back-end: the tree, distribution, cache, planner and
    # round plan. Above the config (the planner prices a run's config, the cache says why a
    # back-end of ``simpipe.config.backends`` cannot share) and the servers (emulator
    # profiles' cost models); below the agents, which ask it for their answers. The round
    # plan's Dask stages, which render and play partitions, are in the run
    # (``run.planned_round``).
    ("simpipe.answers",),
    ("simpipe.agents",),  # how a partition decides
    # a run: where it executes, servers, population, rounds, the dry run's estimate
    ("simpipe.run",),
    ("simpipe.report", "simpipe.ui", "simpipe.bench"),  # readers and benchmarks of runs
    ("simpipe", "simpipe.cli"),  # the Python API and the command line
]
#: The one pipeline module every package may import: the base of the errors a user can fix
#: (``simpipe.core.errors`` imports nothing of simpipe itself).
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
        "from simpipe.core.errors import SimpipeError\n"
        "def f():\n    from simpipe.run.simulation import run_simulation\n"
        "from .. import cluster\n")
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "bad.py").write_text(
        "from simpipe.config.model import Config\nfrom simpipe.games import registry\n")
    assert violations(tmp_path, "games") == [
        "games/bad.py:5 imports simpipe.run.simulation.run_simulation",
        "games/bad.py:6 imports simpipe.cluster"]
    assert violations(tmp_path, "cluster") == ["cluster/bad.py:2 imports simpipe.games.registry"]


def source_modules(root: Path) -> dict[str, Path]:
    """Every module of the source folders under ``root``, by its dotted name."""
    modules = {}
    for folder, package in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            modules[".".join([package, *parts])] = path
    return modules


def _module_of(name: str, modules: dict[str, Path]) -> str | None:
    """The module an imported dotted name is or lies in (None: not one of ours)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def module_graph(root: Path) -> dict[str, dict[str, list[str]]]:
    """Which of our modules each module imports, each edge with its ``file:line`` places."""
    modules = source_modules(root)
    graph: dict[str, dict[str, list[str]]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges = graph.setdefault(module, {})
        for line, name in imported_names(path, package):
            target = _module_of(name, modules)
            place = f"{path.relative_to(root)}:{line}"
            if target is not None and target != module:
                places = edges.setdefault(target, [])
                places += [] if place in places else [place]
    return graph


def unit_of(module: str) -> str:
    """The package-level unit of a module: ``simpipe.run.simulation`` -> ``simpipe.run``,
    ``simpipe.core.errors`` -> ``simpipe.core``."""
    return ".".join(module.split(".")[:2])


def package_graph(root: Path) -> dict[str, dict[str, list[str]]]:
    """``module_graph`` with each module replaced by its unit; imports within a unit drop."""
    graph: dict[str, dict[str, list[str]]] = {}
    for module, edges in module_graph(root).items():
        unit = graph.setdefault(unit_of(module), {})
        for target, places in edges.items():
            if unit_of(target) != unit_of(module):
                known = unit.setdefault(unit_of(target), [])
                known += [p for p in places if p not in known]
    return graph


def find_cycle(graph: dict[str, dict[str, list[str]]]) -> list[str]:
    """One cycle of ``graph`` as its nodes, the first repeated at the end (``[]``: none)."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str]:
        if node in path:
            return [*path[path.index(node):], node]
        if node in done:
            return []
        path.append(node)
        for target in sorted(graph.get(node, {})):
            cycle = visit(target)
            if cycle:
                return cycle
        path.pop()
        done.add(node)
        return []

    for node in sorted(graph):
        cycle = visit(node)
        if cycle:
            return cycle
    return []


def layer_violations(graph: dict[str, dict[str, list[str]]]) -> list[str]:
    """``place: A imports B (a layer above)`` for each import up the layers, and one line
    for each unit without a layer."""
    height = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
    bad = [f"{unit}: in no layer of LAYERS" for unit in sorted(graph) if unit not in height]
    for unit, edges in sorted(graph.items()):
        for target, places in sorted(edges.items()):
            if unit in height and height.get(target, -1) > height[unit]:
                bad += [f"{place}: {unit} imports {target} (a layer above)" for place in places]
    return bad


def test_packages_import_only_their_layer_and_below() -> None:
    assert layer_violations(package_graph(REPO)) == []


def test_each_folder_is_one_unit() -> None:
    """``pipeline/`` holds packages only (and the lazy API in its ``__init__``): a module at
    its root would be a unit of its own, at a height its folder does not show."""
    assert sorted(p.name for p in (REPO / "pipeline").glob("*.py")) == ["__init__.py"]
    assert all(len(unit.split(".")) <= 2 for layer in LAYERS for unit in layer)


def test_neither_packages_nor_modules_import_in_a_cycle() -> None:
    assert find_cycle(package_graph(REPO)) == []
    assert find_cycle(module_graph(REPO)) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_planted_cycle_and_an_import_up_the_layers_are_found(tmp_path: Path) -> None:
    """store -> run only inside a function and run -> store at the top still make a cycle."""
    _write(tmp_path, {
        "pipeline/__init__.py": "", "pipeline/core/errors.py": "",
        "pipeline/run/__init__.py": "", "pipeline/store/__init__.py": "",
        "pipeline/run/simulation.py": "from simpipe.store import ledger\n",
        "pipeline/store/ledger.py": ("from simpipe.core.errors import SimpipeError\n"
                                     "def f():\n    from ..run.simulation import run\n"),
    })
    graph = package_graph(tmp_path)
    assert find_cycle(graph) == ["simpipe.run", "simpipe.store", "simpipe.run"]
    assert find_cycle(module_graph(tmp_path)) == [
        "simpipe.run.simulation", "simpipe.store.ledger", "simpipe.run.simulation"]
    assert layer_violations(graph) == [
        "pipeline/store/ledger.py:3: simpipe.store imports simpipe.run (a layer above)"]
    (tmp_path / "pipeline/store/ledger.py").write_text("import simpipe.core.errors\n")
    (tmp_path / "pipeline/newpkg").mkdir()
    (tmp_path / "pipeline/newpkg/__init__.py").write_text("")
    graph = package_graph(tmp_path)
    assert find_cycle(graph) == []
    assert layer_violations(graph) == ["simpipe.newpkg: in no layer of LAYERS"]


#: A string naming ``module:attribute`` of ours is an import made later (plug-in tables
#: resolve them on first use), so it must follow the layers too.
IMPORT_STRING = re.compile(r"simpipe(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
#: The import strings that still point up the layers, each by its place and target: open
#: work (docs/architecture.md, "Layers"). A new one fails the test; fixing one of these
#: fails it too, until it is taken off this list.
KNOWN_UPWARD_STRINGS = {
    ("pipeline/config/backends.py", "simpipe.agents.registry"),  # the scripted back-end's policy
}


def import_strings(root: Path) -> list[tuple[str, str, str]]:
    """``(file, line, module)`` for each ``"simpipe.module:attribute"`` string constant in
    the source folders under ``root``."""
    found = []
    for path in source_modules(root).values():
        for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and IMPORT_STRING.fullmatch(node.value)):
                found.append((str(path.relative_to(root)), str(node.lineno),
                              node.value.partition(":")[0]))
    return sorted(found)


def upward_import_strings(root: Path) -> list[tuple[str, str]]:
    """``(file, target module)`` for each import string pointing to a higher layer."""
    height = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
    modules = source_modules(root)
    up = []
    for file, _, target in import_strings(root):
        source = next(m for m, p in modules.items() if str(p.relative_to(root)) == file)
        if height.get(unit_of(target), -1) > height.get(unit_of(source), len(LAYERS)):
            up.append((file, target))
    return sorted(set(up))


def test_import_strings_point_down_the_layers_but_the_known_ones() -> None:
    assert any(target == "simpipe.inference.http.tgi" for _, _, target in import_strings(REPO))
    assert set(upward_import_strings(REPO)) == KNOWN_UPWARD_STRINGS


def test_a_planted_import_string_up_the_layers_is_found(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pipeline/__init__.py": "", "pipeline/store/__init__.py": "",
        "pipeline/store/ledger.py": 'PLUGIN = "simpipe.run.simulation:run_simulation"\n'
                                    'FINE = "simpipe.core.errors:SimpipeError"\n'
                                    'TEXT = "simpipe.run is not an import string"\n',
    })
    assert upward_import_strings(tmp_path) == [("pipeline/store/ledger.py",
                                                "simpipe.run.simulation")]


#: The engine subpackages of ``simpipe.inference``: each engine's own code. The shared types
#: (``base``, ``types``, ``settings``, ``answer_checks``, ``cost_model``) sit beside them.
ENGINES = ("simpipe.inference.llamacpp", "simpipe.inference.vllm", "simpipe.inference.http")
#: The only imports from one engine into another: the OpenAI-compatible HTTP back-end talks
#: to servers that run llama.cpp or vLLM, so it speaks each one's probe dialect and models
#: each one's sampler (``agents.openai.answer_distributions``). Module by module, so that
#: anything else (the HTTP side reaching into the embedded engine, llama.cpp and vLLM
#: reaching into each other or into HTTP) fails.
SPEAKS: dict[str, tuple[str, ...]] = {
    "simpipe.inference.http.openai_compat": (
        "simpipe.inference.llamacpp.logprobs", "simpipe.inference.llamacpp.sampler",
        "simpipe.inference.vllm.logprobs", "simpipe.inference.vllm.sampler"),
}


def _engine_of(module: str) -> str | None:
    return next((e for e in ENGINES if _within(module, (e,))), None)


def engine_violations(graph: dict[str, dict[str, list[str]]]) -> list[str]:
    """``place: A imports B (another engine)`` for each import from one engine subpackage
    into another that ``SPEAKS`` does not name."""
    bad = []
    for module, edges in sorted(graph.items()):
        engine = _engine_of(module)
        for target, places in sorted(edges.items()):
            other = _engine_of(target)
            if engine is not None and other is not None and other != engine \
                    and target not in SPEAKS.get(module, ()):
                bad += [f"{place}: {module} imports {target} (another engine)"
                        for place in places]
    return bad


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(root: Path) -> list[str]:
    """``place: A takes B`` for each private name (``_x``: a module's own) that a module
    takes from a module of another package, as ``from m import _x``, ``import p._m`` or
    ``m._x`` on a module it imported. Within one package (the modules of one folder) a
    private name may be shared: the package is the unit that owns it."""
    modules = source_modules(root)

    def package_of(module: str) -> str:
        return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]

    def owner(name: str) -> tuple[str, str] | None:
        """The package that owns ``name`` and the private part, if it names a private
        module or a private name of one of our modules."""
        target = _module_of(name, modules)
        if target is None:
            return None
        if name == target:
            last = target.rpartition(".")[2]
            return (target.rpartition(".")[0], last) if _private(last) else None
        first = name[len(target) + 1:].split(".")[0]
        return (package_of(target), first) if _private(first) else None

    bad = []
    for module, path in modules.items():
        package = package_of(module)
        place = path.relative_to(root)
        aliases: dict[str, str] = {}  # a name bound to one of our modules -> that module
        tree = ast.parse(path.read_text("utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in modules:
                        aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                base = package.rsplit(".", node.level - 1)[0] if node.level else ""
                source = ".".join(p for p in (base, node.module) if p)
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
        for line, name in imported_names(path, package):
            found = owner(name)
            if found is not None and found[0] != package:
                bad.append(f"{place}:{line}: {module} takes {name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases and _private(node.attr):
                target = aliases[node.value.id]
                if package_of(target) != package:
                    bad.append(f"{place}:{node.lineno}: {module} takes {target}.{node.attr}")
    return sorted(set(bad))


def test_no_engine_imports_another() -> None:
    assert all((REPO / "pipeline" / e.split(".", 1)[1].replace(".", "/")).is_dir()
               for e in ENGINES)
    assert engine_violations(module_graph(REPO)) == []


def test_no_module_takes_another_packages_private_names() -> None:
    assert private_imports(REPO) == []


def test_an_engine_import_and_a_taken_private_name_are_found(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pipeline/__init__.py": "", "pipeline/inference/__init__.py": "",
        "pipeline/agents/__init__.py": "",
        "pipeline/inference/llamacpp/__init__.py": "",
        "pipeline/inference/vllm/__init__.py": "",
        "pipeline/inference/http/__init__.py": "",
        "pipeline/inference/vllm/sampler.py": "def _floor():\n    pass\n",
        "pipeline/inference/llamacpp/sampler.py": "_LIMIT = 1\n",
        # one package: its modules share private names
        "pipeline/inference/llamacpp/batch.py": ("from .sampler import _LIMIT\n"
                                                 "from simpipe.inference.vllm import sampler\n"),
        # named in SPEAKS: allowed; the private name is not
        "pipeline/inference/http/openai_compat.py": (
            "from simpipe.inference.vllm import sampler as vllm_sampler\n"
            "def f():\n    return vllm_sampler._floor()\n"),
        "pipeline/inference/http/tgi.py": "import simpipe.inference.llamacpp.sampler\n",
        "pipeline/agents/llm.py": "from simpipe.inference.llamacpp.sampler import _LIMIT\n",
    })
    assert engine_violations(module_graph(tmp_path)) == [
        "pipeline/inference/http/tgi.py:1: simpipe.inference.http.tgi imports "
        "simpipe.inference.llamacpp.sampler (another engine)",
        "pipeline/inference/llamacpp/batch.py:2: simpipe.inference.llamacpp.batch imports "
        "simpipe.inference.vllm.sampler (another engine)"]
    assert private_imports(tmp_path) == [
        "pipeline/agents/llm.py:1: simpipe.agents.llm takes "
        "simpipe.inference.llamacpp.sampler._LIMIT",
        "pipeline/inference/http/openai_compat.py:3: simpipe.inference.http.openai_compat "
        "takes simpipe.inference.vllm.sampler._floor"]
