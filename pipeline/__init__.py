"""simpipe: very large LLM multi-agent simulations as a Dask batch pipeline.

The notebook API mirrors the CLI::

    import simpipe
    config = simpipe.load_config("examples/quickstart.toml", ["game.rounds=5"])
    result = simpipe.run_simulation(config)
    result.summary            # one row per (round, group)
    result.rounds()           # one row per agent per round
    simpipe.read_ledger(result.run_dir).completed_rounds()   # run.json, typed
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Resolved on first use so `import simpipe` (and `simpipe validate`) stays light;
# "module:attribute" where the module's own name for it differs.
_EXPORTS = {
    "Config": "simpipe.config.model",
    "ConfigError": "simpipe.config.model",
    "SimpipeError": "simpipe.core.errors",
    "load_config": "simpipe.config.model",
    "config_from_dict": "simpipe.config.model",
    "run_simulation": "simpipe.run.simulation",
    "RunResult": "simpipe.run.simulation",
    "Executor": "simpipe.run.executor",
    "executor_for": "simpipe.run.executor",
    "cluster_up": "simpipe.run.lifecycle:up",
    "cluster_status": "simpipe.run.lifecycle:status",
    "cluster_down": "simpipe.run.lifecycle:down",
    "write_batch_script": "simpipe.run.batch_task",
    "read_summary": "simpipe.store.results",
    "read_rounds": "simpipe.store.results",
    "read_population": "simpipe.store.results",
    "read_ledger": "simpipe.store.results",
    "RunRecord": "simpipe.store.record",
    "build_population": "simpipe.run.population",
    "build_report": "simpipe.report.build",
    "load_experiment": "simpipe.run.experiment",
    "run_experiment": "simpipe.run.experiment",
    "ExperimentResult": "simpipe.run.experiment",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'simpipe' has no attribute {name!r}")
    module, _, attribute = where.partition(":")
    return getattr(importlib.import_module(module), attribute or name)
