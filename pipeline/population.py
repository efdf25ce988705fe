"""Building a population once per spec and linking it into each run that uses it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from distributed import Client, as_completed

from simpipe.config import Config
from simpipe.files import remove_stale_temps, write_json_atomic, write_parquet_atomic
from simpipe.layout import RunPaths, part_name, population_cache
from simpipe.personas.config import PopulationConfig
from simpipe.personas.sampling import sample_partition

SPEC_FILE = "_population.json"  # leading "_": Parquet readers skip it


def build_population_part(population: PopulationConfig, seed: int, partition: int,
                          path: str) -> int:
    """Worker task: sample one partition and write it, unless a previous build did."""
    out = Path(path)
    if not out.exists():
        write_parquet_atomic(sample_partition(population, seed, partition), out)
    return partition


def ensure_population(client: Client, config: Config, paths: RunPaths,
                      on_progress: Callable[[int, int], None] | None = None) -> Path:
    """The run's ``population/`` directory, built (or reused from the cache) and complete."""
    cache = population_cache(Path(config.run.output_dir), config.population_hash())
    n = config.population.n_partitions
    remove_stale_temps(cache) if cache.exists() else None
    missing = [k for k in range(n) if not (cache / part_name(k)).exists()]
    if missing:
        futures = [
            client.submit(build_population_part, config.population, config.run.seed, k,
                          str(cache / part_name(k)), key=f"population-{cache.name}-{k}", pure=False)
            for k in missing
        ]
        done = n - len(missing)
        for future in as_completed(futures):
            future.result()
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
    write_json_atomic(spec, cache / SPEC_FILE)
    _link_dir(cache, paths.population, [part_name(k) for k in range(n)] + [SPEC_FILE])
    return paths.population


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
