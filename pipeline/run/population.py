"""Building a population once per spec and linking it into each run that uses it.

A part file already on disk is checked (this partition's agent ids, in order) before it is
reused, in the cache and in the run; a corrupt one is moved aside and built again. The spec
file beside the parts (``_population.json``) is read back like every file of a run: a
regular file of bounded size, its counts within the bounds of ``[population]``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import pyarrow.parquet as pq
from distributed import Client, as_completed
from pydantic import Field

from simpipe.agents.registry import close_engines_on_shutdown
from simpipe.config.model import AgentsConfig, Config
from simpipe.core.files import (
    move_aside,
    remove_stale_temps,
    write_json_atomic,
    write_parquet_atomic,
)
from simpipe.core.records import CorruptFile, StrictRecord, read_json_model
from simpipe.personas.config import MAX_PARTITIONS, MAX_POPULATION, PopulationConfig
from simpipe.personas.meta_prompt import prompt_hash
from simpipe.personas.sampling import partition_bounds, sample_partition
from simpipe.run.console import Console
from simpipe.run.persona_build import BackendFactory, PersonaStats, add_personas
from simpipe.store.integrity import check_part
from simpipe.store.layout import SPEC_FILE, RunPaths, part_name, population_cache

MAX_SPEC_BYTES = 16 * 2**20  # the [population] section and persona counts: kilobytes


class PopulationSpec(StrictRecord):
    """``_population.json``: what a built population was built from."""

    population_hash: str | None = None
    seed: int | None = None
    n_agents: Annotated[int, Field(ge=1, le=MAX_POPULATION)] | None = None
    n_partitions: Annotated[int, Field(ge=1, le=MAX_PARTITIONS)] | None = None
    population: dict[str, Any]
    persona: dict[str, Any] | None = None


def read_population_spec(path: Path) -> PopulationSpec:
    """A population's spec file; CorruptFile naming it when it is missing, not a regular
    file, too big, not JSON or a field has the wrong type or an implausible count."""
    return read_json_model(path, PopulationSpec, MAX_SPEC_BYTES)


@dataclass(frozen=True)
class BuiltPopulation:
    """What ``build_population`` made: the run's ``population/`` folder (read it with
    ``simpipe.read_population(run_dir)``) and how long it took."""

    path: Path
    n_agents: int
    n_partitions: int
    wall_s: float


def build_population(config: Config, client: Client | None = None,
                     on_progress: Callable[[int, int], None] | None = None,
                     warn: Callable[[str], None] | None = None) -> BuiltPopulation:
    """``simpipe population build``: sample the population of ``config`` (and its personas)
    into ``<output_dir>/<name>/population/``, reusing the cache. Without ``client``, the
    configured cluster is started for the build and stopped after it. ``on_progress(done,
    total)`` is called per partition; ``warn`` gets one line per corrupt part set aside."""
    start = time.perf_counter()
    paths = RunPaths(config.run_dir)
    if client is not None:
        out = ensure_population(client, config, paths, on_progress=on_progress, warn=warn)
    else:
        from simpipe.run.executor import cluster_client  # imports dask-jobqueue

        with cluster_client(config.cluster, say=warn) as own:
            out = ensure_population(own, config, paths, on_progress=on_progress, warn=warn)
    return BuiltPopulation(out, config.population.size, config.population.n_partitions,
                           time.perf_counter() - start)


def build_population_part(population: PopulationConfig, seed: int, partition: int,
                          path: str, persona_agents: AgentsConfig | None = None,
                          backend_factory: BackendFactory | None = None) -> dict:
    """Worker task: sample one partition, add its personas and write it, unless a previous
    build did (the part file is the completion marker). Returns the persona step's stats."""
    out = Path(path)
    if out.exists():
        return PersonaStats().as_dict()
    frame = sample_partition(population, seed, partition)
    frame, stats = add_personas(frame, population, seed, persona_agents, backend_factory)
    write_parquet_atomic(frame, out)
    return stats.as_dict()


def ensure_population(client: Client, config: Config, paths: RunPaths,
                      on_progress: Callable[[int, int], None] | None = None,
                      backend_factory: BackendFactory | None = None,
                      warn: Callable[[str], None] | None = None) -> Path:
    """The run's ``population/`` directory, built (or reused from the cache) and complete.

    ``backend_factory`` replaces the persona generator's back-end (tests inject one);
    ``warn`` gets one line per corrupt part file found (default: the console)."""
    cache = population_cache(Path(config.run.output_dir), config.population_hash())
    n = config.population.n_partitions
    warn = warn or Console().warn
    if cache.exists():
        remove_stale_temps(cache)
    bounds = partition_bounds(config.population.size, n)
    missing = [k for k in range(n) if not _usable(cache / part_name(k), bounds[k], warn)]
    persona = config.population.persona
    persona_agents = config.persona_agents if persona.mode == "llm" else None
    build = {"partitions_built": len(missing), "llm_requests": 0, "tokens_out": 0,
             "rejected": Counter()}
    if missing:
        if persona_agents is not None:
            close_engines_on_shutdown(client)  # the persona generator's model, once built
        futures = [
            client.submit(build_population_part, config.population, config.run.seed, k,
                          str(cache / part_name(k)), persona_agents, backend_factory,
                          key=f"population-{cache.name}-{k}", pure=False)
            for k in missing
        ]
        done = n - len(missing)
        for future in as_completed(futures):
            stats = future.result()
            build["llm_requests"] += stats["llm_requests"]
            build["tokens_out"] += stats["tokens_out"]
            build["rejected"].update(stats["rejected"])
            done += 1
            if on_progress:
                on_progress(done, n)
    spec = {
        "population_hash": config.population_hash(),
        "seed": config.run.seed,
        "n_agents": config.population.size,
        "n_partitions": n,
        "population": config.population.model_dump(mode="json"),
    }
    if persona.mode != "none":
        spec["persona"] = _persona_meta(config, cache, n, build)
    write_json_atomic(spec, cache / SPEC_FILE)
    # The spec file is rewritten on every build: relink it so the run sees this one.
    (paths.population / SPEC_FILE).unlink(missing_ok=True)
    for k in range(n):  # a run's own copy (or a link to a part rebuilt since) is checked too
        run_part = paths.population_part(k)
        if run_part.exists() and not run_part.samefile(cache / part_name(k)):
            _usable(run_part, bounds[k], warn, then="linking the checked build")
    _link_dir(cache, paths.population, [part_name(k) for k in range(n)] + [SPEC_FILE])
    return paths.population


def _usable(part: Path, agents: tuple[int, int], warn: Callable[[str], None],
            then: str = "building it again") -> bool:
    """Whether a part file can be reused; a corrupt one is moved aside (and reported)."""
    if not part.exists():
        return False
    try:
        check_part(part, agents)
    except CorruptFile as exc:
        warn(f"{exc}; moved aside to {move_aside(part).name}, {then}")
        return False
    return True


def _persona_meta(config: Config, cache: Path, n: int, build: dict) -> dict:
    persona = config.population.persona
    sources: Counter = Counter()
    for k in range(n):
        column = pq.read_table(cache / part_name(k), columns=["persona_source"]).column(0)
        sources.update(column.to_pandas().value_counts().to_dict())
    meta = {
        "mode": persona.mode,
        "template": config.population.persona_template,
        "sources": {k: int(v) for k, v in sources.items() if v},
        "this_build": {**build, "rejected": dict(build["rejected"])},
    }
    if persona.mode == "llm":
        meta["generator"] = config.persona_agents.identity()
        meta["prompt_hash"] = prompt_hash()
    return meta


def _link_dir(src: Path, dst: Path, names: list[str]) -> None:
    """Hard links where the filesystem allows (no copy of a million-row build), else copies."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in names:
        target = dst / name
        if target.exists():
            continue
        try:
            os.link(src / name, target)
        except OSError:
            shutil.copy2(src / name, target)
