"""Back-ends and server kinds are named in their registries only.

``simpipe.config.backends.BACKENDS`` names the back-ends (``agents.backend``) and
``simpipe.cluster.server_kinds.SERVER_KINDS`` the server kinds (``cluster.servers.kind``);
whatever differs between them is declared there. Code elsewhere that compares against such a
name, or uses one as a key, decides per back-end or kind behind the registry's back: adding
one would then need edits all over. Checked on the source with ``ast``: text (docstrings,
descriptions, messages) and values (a config naming its back-end) are not decisions.

A new back-end, server kind or cluster kind is one registry entry: the config, the launcher
and the executor take it up with no other edit (``simpipe.cluster.kinds.CLUSTER_KINDS``: a
cluster kind is one plug-in object, its settings model and its executor).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from simpipe.cluster.server_kinds import SERVER_KINDS
from simpipe.config.backends import BACKENDS

from support import REPO

FOLDERS = ("pipeline", "cluster", "games", "personas")
BACKEND_HOME = "pipeline/config/backends.py"
KIND_HOME = "cluster/server_kinds.py"
#: Names that are also ordinary values ("none": a container, a worker lifetime, a persona
#: grammar): only a comparison with a ``kind`` counts.
AMBIGUOUS = frozenset({"none"})
#: ``(file, name, how)`` uses outside the registries that are not decisions. Keep it short.
ALLOWED = frozenset({
    # Benchmarks of one named back-end (and emulated servers) build its config as data,
    # the way a user's TOML names [agents.<backend>] and [cluster.servers.emulated].
    ("pipeline/bench/engine.py", "llamacpp", "key"),
    ("pipeline/bench/engine.py", "openai", "key"),
    ("pipeline/bench/fleet.py", "tgi", "key"),
    ("pipeline/bench/fleet.py", "emulated", "key"),
    ("pipeline/bench/scale.py", "scripted", "key"),
    ("pipeline/bench/share.py", "llamacpp", "key"),
    ("pipeline/bench/share.py", "openai", "key"),
    ("pipeline/bench/share.py", "emulated", "key"),
    # `simpipe bench share --case openai` is a case's name (the bench's own row), not a
    # back-end decision.
    ("pipeline/bench/share.py", "openai", "compare"),
    # `agents.openai.answer_distributions = "llamacpp"` names the wire protocol of
    # log-probabilities (llama.cpp's server routes, vLLM's the other case), not a back-end.
    ("pipeline/inference/http/openai_compat.py", "llamacpp", "compare"),
    # The [cluster.servers.emulated] table of a config being rewritten, not the kind.
    ("pipeline/run/emulate.py", "emulated", "key"),
    # The emulator's wire protocols (HTTP route sets and error styles), named after the
    # servers they imitate.
    ("pipeline/servers/contract.py", "tgi", "compare"),
    ("pipeline/servers/contract.py", "tgi", "key"),
    ("pipeline/servers/contract.py", "openai", "key"),
    ("pipeline/servers/emulator.py", "openai", "compare"),
})


def _strings(node: ast.AST) -> Iterator[ast.Constant]:
    """The string constants of an operand: itself, or the items of a literal collection."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for item in node.elts:
            yield from _strings(item)


def _is_kind(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "kind") or (
        isinstance(node, ast.Attribute) and node.attr == "kind")


def name_uses(source: str, names: frozenset[str]) -> list[tuple[int, str, str]]:
    """``(line, name, how)`` for each of ``names`` compared against ("compare": ``==``,
    ``in``, ``match``) or used as a key ("key": a dict literal's key, a subscript,
    ``.get``/``.pop``/``.setdefault``, ``getattr``/``hasattr``)."""
    found: list[tuple[ast.AST, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            kind = any(_is_kind(o) for o in operands)
            found += [(c, "compare") for o in operands for c in _strings(o)
                      if c.value not in AMBIGUOUS or kind]
        elif isinstance(node, ast.MatchValue):
            found += [(c, "compare") for c in _strings(node.value)]
        elif isinstance(node, ast.Dict):
            found += [(k, "key") for k in node.keys if k is not None]
        elif isinstance(node, ast.Subscript):
            found.append((node.slice, "key"))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault"):
                found.append((node.args[0], "key"))
            elif (isinstance(func, ast.Name) and func.id in ("getattr", "hasattr")
                  and len(node.args) > 1):
                found.append((node.args[1], "key"))
    uses = {(c.lineno, c.value, how) for c, how in found
            if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in names
            and (how == "compare" or c.value not in AMBIGUOUS)}
    return sorted(uses)


def violations(root: Path, backends: frozenset[str], kinds: frozenset[str],
               allowed: frozenset[tuple[str, str, str]] = ALLOWED) -> list[str]:
    """``file:line name (how)`` for each use of a back-end or server-kind name outside its
    registry module and the allow-list."""
    homes: dict[str, set[str]] = {}
    for name in backends:
        homes.setdefault(name, set()).add(BACKEND_HOME)
    for name in kinds:
        homes.setdefault(name, set()).add(KIND_HOME)
    bad = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for line, name, how in name_uses(path.read_text("utf-8"), frozenset(homes)):
                if rel not in homes[name] and (rel, name, how) not in allowed:
                    bad.append(f"{rel}:{line} {name!r} ({how})")
    return bad


def test_backend_and_server_kind_names_appear_only_in_their_registries() -> None:
    assert {"scripted", "llamacpp", "tgi", "openai"} <= set(BACKENDS)
    assert {"none", "tgi", "vllm", "llamacpp", "custom", "emulated"} <= set(SERVER_KINDS)
    assert violations(REPO, frozenset(BACKENDS), frozenset(SERVER_KINDS)) == []


def test_every_allowed_use_still_exists() -> None:
    """An allow-list entry whose use is gone is removed, so that it hides nothing new."""
    unused = []
    for rel, name, how in sorted(ALLOWED):
        uses = name_uses((REPO / rel).read_text("utf-8"), frozenset({name}))
        if not any(h == how for _, _, h in uses):
            unused.append((rel, name, how))
    assert unused == []


def _plant(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_planted_violation_is_found(tmp_path: Path) -> None:
    _plant(tmp_path, "pipeline/run/bad.py", '''"""Runs on "tgi" or "openai" servers."""
def f(config, cfg, table, backend):
    if config.agents.backend == "scripted":
        return 1
    if backend in ("tgi", "openai"):
        return table["llamacpp"]
    if cfg.servers.kind != "none" and cfg.container != "none":
        return getattr(config.agents, "openai")
    match backend:
        case "tgi":
            pass
    return {"vllm": 1}.get("custom"), f"agents.backend = {backend!r}: use tgi", \\
        dict(backend="llamacpp"), ("openai",)
''')
    # A registry module may name its own entries, and only those.
    _plant(tmp_path, "cluster/server_kinds.py", 'X = {"emulated": 1}\nY = {"scripted": 1}\n')
    _plant(tmp_path, "pipeline/config/backends.py", 'X = {"scripted": 1}\nY = {"vllm": 1}\n')
    # An allowed use passes; the same name used another way in that file does not.
    _plant(tmp_path, "pipeline/bench/scale.py",
           'RAW = {"agents": {"backend": "scripted", "scripted": {}}}\n'
           'def g(b):\n    return b == "scripted"\n')
    backends = frozenset({"scripted", "llamacpp", "tgi", "openai"})
    kinds = frozenset({"none", "tgi", "vllm", "llamacpp", "custom", "emulated"})
    assert violations(tmp_path, backends, kinds) == [
        "pipeline/bench/scale.py:3 'scripted' (compare)",
        "pipeline/config/backends.py:2 'vllm' (key)",
        "pipeline/run/bad.py:3 'scripted' (compare)",
        "pipeline/run/bad.py:5 'openai' (compare)",
        "pipeline/run/bad.py:5 'tgi' (compare)",
        "pipeline/run/bad.py:6 'llamacpp' (key)",
        "pipeline/run/bad.py:7 'none' (compare)",
        "pipeline/run/bad.py:8 'openai' (key)",
        "pipeline/run/bad.py:10 'tgi' (compare)",
        "pipeline/run/bad.py:12 'custom' (key)",
        "pipeline/run/bad.py:12 'vllm' (key)",
        "cluster/server_kinds.py:2 'scripted' (key)",
    ]


# Registers one more back-end and one more server kind before the config is imported, as an
# entry in the registries would, and reports what the rest of the code makes of them.
_NEW_PLUGINS = r'''
import json
from simpipe.config.backends import BACKENDS, BackendPlugin
from simpipe.cluster.server_kinds import SERVER_KINDS, ServerKindPlugin
from simpipe.inference.settings import TgiSettings

BACKENDS["echo"] = BackendPlugin("echo", TgiSettings,
                                 engine="simpipe.inference.http.tgi:TgiBackend",
                                 summary="a test back-end", takes_endpoints=True)
SERVER_KINDS["fake"] = ServerKindPlugin("fake", "a test server", endpoint_backend="echo",
                                        template="{python} -m fake_server --port {port}")

from simpipe.cluster.servers import server_command
from simpipe.cluster.state import run_target
from simpipe.config.model import AgentsConfig, ConfigError, config_from_dict, persona_agents_config

def echo(endpoints):
    return config_from_dict({"agents": {"backend": "echo", "echo": {"endpoints": endpoints}},
                             "cluster": {"kind": "slurm",
                                         "servers": {"kind": "fake", "port": 9000}}})

a, b = echo(["http://a:1"]), echo(["http://b:1"])
errors = {}
for name, raw in {"backend": {"agents": {"backend": "nope"}},
                  "kind": {"cluster": {"servers": {"kind": "nope"}}},
                  "local": {"cluster": {"kind": "local", "servers": {"kind": "fake"}}}}.items():
    try:
        config_from_dict(raw)
    except ConfigError as exc:
        errors[name] = str(exc)
servers = a.cluster.servers
state = {"name": "c", "state": "ready", "scheduler": "tcp://s:1", "endpoint_backend": "echo",
         "servers": [{"url": "http://e:1", "healthy": True}]}
print(json.dumps({
    "same_results_hash": a.results_hash() == b.results_hash(),
    "backend_description": AgentsConfig.model_fields["backend"].description,
    "persona_backend": persona_agents_config({"backend": "echo"}).backend,
    "endpoint_backend": servers.endpoint_backend,
    "command": server_command(servers, servers.port, python="py"),
    "kind_description": type(servers).model_fields["kind"].description,
    "run_target": run_target(state, "echo", BACKENDS["echo"].takes_endpoints),
    "errors": errors,
}))
'''


def test_a_new_backend_and_server_kind_are_one_registry_entry_each() -> None:
    proc = subprocess.run([sys.executable, "-c", _NEW_PLUGINS], capture_output=True,
                          text=True, cwd=REPO, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["same_results_hash"]  # its endpoints are where it runs, not what it answers
    assert "`echo` (a test back-end)" in out["backend_description"]
    assert out["persona_backend"] == "echo"  # an LLM back-end may write personas
    assert out["endpoint_backend"] == "echo"
    assert out["command"] == "py -m fake_server --port 9000"
    assert "`fake` (a test server)" in out["kind_description"]
    assert out["run_target"] == ["tcp://s:1", ["http://e:1"]]
    assert "'echo'" in out["errors"]["backend"]
    assert "'fake'" in out["errors"]["kind"]
    assert 'cluster.servers.kind = "fake" needs cluster.kind = "slurm"' in out["errors"]["local"]


# One more cluster kind, declared as one plug-in object (its settings model and its executor,
# here a LocalCluster of threads in this process) and registered before the config is
# imported, as an entry in simpipe.cluster.kinds.CLUSTER_KINDS would be. A process of its
# own: the registration ends with it.
_NEW_CLUSTER_KIND = r'''
import json, sys
from contextlib import ExitStack
from typing import Literal

from pydantic import Field, StrictInt

from simpipe.cluster.config import ClusterSettings
from simpipe.cluster.kinds import CLUSTER_KINDS
from simpipe.cluster.plugin import ClusterKind, Workers


class ThreadsClusterConfig(ClusterSettings):
    kind: Literal["threads"] = "threads"
    threads: StrictInt = Field(2, ge=1, description="partitions played at once")


class ThreadWorkers(Workers[ThreadsClusterConfig]):
    def connect(self, stack: ExitStack):
        from distributed import Client, LocalCluster

        cluster = stack.enter_context(LocalCluster(
            n_workers=1, threads_per_worker=self.settings.threads, processes=False,
            dashboard_address=None))
        return stack.enter_context(Client(cluster))


CLUSTER_KINDS["threads"] = ClusterKind(ThreadsClusterConfig, ThreadWorkers)

import simpipe
from simpipe.config.model import ConfigError, config_from_dict
from simpipe.run.console import Console
from simpipe.run.executor import executor_for
from simpipe.store.results import read_rounds

raw = {"run": {"name": "toy", "seed": 1, "output_dir": sys.argv[1]},
       "population": {"size": 40, "partitions": 2, "attributes": {"age": {"min": 18, "max": 80}}},
       "game": {"rounds": 2}, "agents": {"backend": "scripted"},
       "cluster": {"kind": "threads", "threads": 3}}
config = config_from_dict(raw)
errors = {}
for name, cluster in {"other_kinds_key": {"kind": "threads", "workers": 2},
                      "unknown_kind": {"kind": "nope"}}.items():
    try:
        config_from_dict({**raw, "cluster": cluster})
    except ConfigError as exc:
        errors[name] = str(exc)
with executor_for(config, say=lambda _: None) as executor:
    result = simpipe.run_simulation(config, executor=executor, console=Console(quiet=True))
    nthreads = executor.client.nthreads()
print(json.dumps({
    "settings": type(config.cluster).__name__, "threads": config.cluster.threads,
    "workers": type(executor.workers).__name__ if executor.workers else None,
    "nthreads": sorted(nthreads.values()), "rows": len(read_rounds(result.run_dir)),
    "errors": errors,
}))
'''


def test_a_new_cluster_kind_is_one_plugin_object(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _NEW_CLUSTER_KIND, str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # Validation takes its own keys, typed by its own model ...
    assert out["settings"] == "ThreadsClusterConfig" and out["threads"] == 3
    # ... refuses another kind's, naming the key and the kind, and lists it among the kinds.
    assert ("unknown key 'cluster.workers' for cluster.kind = 'threads'; allowed here: kind, "
            "servers, threads") in out["errors"]["other_kinds_key"]
    assert "'threads'" in out["errors"]["unknown_kind"]
    # executor_for runs it: a whole (tiny) run on its one in-process worker.
    assert out["workers"] is None  # left: what it started is gone
    assert out["nthreads"] == [3]
    assert out["rows"] == 2 * 40
