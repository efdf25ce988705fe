"""The README matches the code: the module map (docs/architecture.md) names every package and
only modules that exist, the README's command table every command, its test command is the
one CI runs, and it stays short enough to read (at most 20,000 characters)."""

from __future__ import annotations

import importlib
import pkgutil
import re
import tomllib
from pathlib import Path

import click

from simpipe.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
_CODE = re.compile(r"`([^`]+)`")


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section (up to the next heading of that level)."""
    match = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README.md has no '## {heading}' section"
    return match.group(1)


def table_rows(body: str) -> list[list[str]]:
    """The cells of each data row of the first Markdown table in ``body``."""
    rows = [line for line in body.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows[2:]]


def module_map(text: str) -> dict[str, list[str]]:
    """Package -> the modules its rows name, from the module map (docs/architecture.md)."""
    named: dict[str, list[str]] = {}
    for cells in table_rows(section(text, "Module map")):
        package = next((c for c in _CODE.findall(cells[0]) if c.startswith("simpipe")), None)
        assert package, f"module map row without a `simpipe...` package: {cells[0]}"
        named.setdefault(package, []).extend(_CODE.findall(cells[1]))
    return named


def installed_packages() -> list[str]:
    """What pyproject.toml installs (the source of truth for the package layout)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return list(pyproject["tool"]["setuptools"]["packages"])


def map_problems(named: dict[str, list[str]], packages: list[str]) -> list[str]:
    problems = [f"package {p} is missing from the map" for p in packages if p not in named]
    problems += [f"the map names package {p}, which is not installed"
                 for p in named if p not in packages]
    for package, modules in named.items():
        for module in modules:
            try:
                importlib.import_module(f"{package}.{module}")
            except ModuleNotFoundError as exc:
                problems.append(f"{package}.{module} does not exist ({exc})")
        if package not in packages:
            continue
        path = importlib.import_module(package).__path__
        present = {m.name for m in pkgutil.iter_modules(path) if not m.ispkg}
        problems += [f"module {package}.{m} is not in the map: add it to a {package} row"
                     for m in sorted(present - set(modules))]
    return problems


def test_the_module_map_names_every_package_and_module_and_each_imports():
    problems = map_problems(module_map(ARCHITECTURE.read_text(encoding="utf-8")),
                            installed_packages())
    assert not problems, "docs/architecture.md module map:\n" + "\n".join(problems)


def test_the_readme_is_short_and_points_to_the_architecture():
    text = README.read_text(encoding="utf-8")
    assert len(text) <= 20_000, f"README.md has {len(text):,} characters: move detail to docs/"
    assert "(docs/architecture.md)" in section(text, "Architecture")


#: Folders under tests/ that hold no package's tests: shared data files.
NOT_A_PACKAGE = {"data"}


def folder_problems(tests: Path, packages: list[str]) -> list[str]:
    """One line for each test folder that names no installed package (``tests/run`` is the
    tests of ``simpipe.run``; ``tests/inference/http`` of ``simpipe.inference.http``) and for
    each test file at the top of ``tests/`` that is not a check of the whole repository."""
    problems = []
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir()):
        parts = folder.relative_to(tests).parts
        if parts[0] in NOT_A_PACKAGE or "__pycache__" in parts:
            continue
        if ".".join(["simpipe", *parts]) not in packages:
            problems.append(f"tests/{'/'.join(parts)} names no package: move its tests to "
                            "the folder of the package they test")
    problems += [f"tests/{p.name} is at the top: move it to the folder of its package"
                 for p in sorted(tests.glob("test_*.py")) if p.name not in WHOLE_REPO_CHECKS]
    return problems


def test_a_map_with_a_wrong_name_or_a_missing_package_is_caught():
    text = ("## Module map\n\n| package | modules | what |\n|---|---|---|\n"
            "| `simpipe.games` (`games/`) | `config`, `no_such_module` | x |\n\n## Next\n")
    problems = map_problems(module_map(text), ["simpipe.games", "simpipe.personas"])
    assert "package simpipe.personas is missing from the map" in problems
    assert any(p.startswith("simpipe.games.no_such_module does not exist") for p in problems)
    # Modules of a mapped package that the row leaves out are named, one line each.
    assert "module simpipe.games.parsing is not in the map: add it to a simpipe.games row" \
        in problems


def _commands(group: click.Group, prefix: str) -> list[str]:
    found = []
    for name, command in sorted(group.commands.items()):
        if command.hidden:  # internal (run inside a batch job), not for users
            continue
        if isinstance(command, click.Group):
            found += _commands(command, f"{prefix} {name}")
        else:
            found.append(f"{prefix} {name}")
    return found


def test_the_command_table_lists_every_command():
    rows = table_rows(section(README.read_text(encoding="utf-8"), "Command line"))
    listed = {_CODE.findall(cells[0])[0] for cells in rows}
    missing = [c for c in _commands(main, "simpipe")
               if not any(row == c or row.startswith(c + " ") for row in listed)]
    assert not missing, f"commands missing from the README's command table: {missing}"


_OUTPUT = re.compile(r"\s+(\||[12&]?>)")  # what may follow a step: a pipe or a redirection


def _steps(command: str) -> list[str]:
    return [step.strip() for step in command.split("&&") if step.strip()]


def _is_step(step: str, wanted: str) -> bool:
    """``step`` runs ``wanted`` as it is: the same words, then at most where its output goes
    (``pytest 2>&1 | tee log`` runs ``pytest``; ``pytest -k x`` does not)."""
    return step == wanted or (step.startswith(wanted)
                              and _OUTPUT.match(step, len(wanted)) is not None)


def runs_in_order(command: str, script: str) -> bool:
    """Whether ``script`` runs every ``&&`` step of ``command``, in that order (on one line or
    several, other commands between them; a step may be followed by its redirections or a
    pipe, e.g. ``python -m pytest 2>&1 | tee log``)."""
    wanted = _steps(command)
    found = 0
    for line in script.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for step in _steps(line):
            if found < len(wanted) and _is_step(step, wanted[found]):
                found += 1
    return found == len(wanted)


def test_the_readme_test_command_is_what_ci_runs():
    setup = section(README.read_text(encoding="utf-8"), "Set up (fresh machine, Python 3.11+)")
    blocks = re.findall(r"```bash\n(.*?)\n```", setup, re.S)
    assert len(blocks) == 2, "Set up has two commands: the quickstart and the test suite"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert runs_in_order(blocks[1], ci), (
        f".ci/run does not run the README's test command {blocks[1]!r}: keep them in sync")


def test_ci_may_split_the_command_but_not_drop_or_reorder_a_step():
    command = 'python3 -m venv .venv && . .venv/bin/activate && pip install -e . && pytest'
    assert runs_in_order(command, f"set -e\n{command} 2>&1 | tee log\n")
    split = ("python3 -m venv .venv && . .venv/bin/activate && pip install -e .\n"
             "ruff check .\npytest 2>&1 | tee log\n")
    assert runs_in_order(command, split)
    assert not runs_in_order(command, "python3 -m venv .venv && . .venv/bin/activate\npytest\n")
    assert not runs_in_order(command, "pytest\npython3 -m venv .venv && . .venv/bin/activate "
                                      "&& pip install -e .\n")
    assert not runs_in_order(command, f"# {command}\n")
    # Another command is not the step: `pytest -k x` runs a part of the suite.
    assert not runs_in_order(command, "python3 -m venv .venv && . .venv/bin/activate && "
                                  "pip install -e . && pytest -k x\n")


#: The tests at the top of tests/: checks of the whole repository, not of one package.
WHOLE_REPO_CHECKS = {"test_import_direction.py", "test_architecture_doc.py", "test_readme.py",
                     "test_docs_links.py", "test_docs_example.py", "test_registries.py",
                     "test_suite_workers.py"}


def test_tests_mirror_the_packages():
    problems = folder_problems(ROOT / "tests", installed_packages())
    assert not problems, "\n".join(problems)


def test_a_test_folder_or_file_out_of_place_is_caught(tmp_path: Path):
    for folder in ("run", "inference/http", "data/x", "runs"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "test_readme.py").write_text("")
    (tmp_path / "test_executor.py").write_text("")
    assert folder_problems(tmp_path, ["simpipe.run", "simpipe.inference",
                                              "simpipe.inference.http"]) == [
        "tests/runs names no package: move its tests to the folder of the package they test",
        "tests/test_executor.py is at the top: move it to the folder of its package"]
