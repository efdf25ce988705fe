"""``simpipe population show DIR``: a built population against the spec it was built from.

The command imports numpy, pandas and the checks inside its function: ``simpipe --help``
stays light.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import click

from simpipe.core.errors import SimpipeError
from simpipe.store.layout import SPEC_FILE


def _population_dir(path: Path) -> Path | None:
    """DIR may be a run directory, its ``population/`` or a cache entry."""
    for candidate in (path, path / "population"):
        spec = candidate / SPEC_FILE
        if spec.exists() or spec.is_symlink():  # what it is, the reader checks and names
            return candidate
    return None


@click.command("show")
@click.argument("directory", metavar="DIR", type=click.Path(exists=True, file_okay=False))
@click.option("--samples", default=3, show_default=True, help="Sample personas to print.")
def population_show(directory: str, samples: int) -> None:
    """Counts per attribute (and per parent label) against the requested shares, a
    chi-square p-value for random sampling, and a few sample personas."""
    import numpy as np  # keep `simpipe --help` light
    import pandas as pd

    from simpipe.core.records import CorruptFile
    from simpipe.personas.checks import attribute_report
    from simpipe.personas.config import ConditionalAttribute, PopulationConfig
    from simpipe.run.population import read_population_spec

    pop_dir = _population_dir(Path(directory))
    if pop_dir is None:
        raise SimpipeError(f"{directory}: no {SPEC_FILE} here or in population/ (build it "
                           "with `simpipe population build CONFIG`)")
    spec = pop_dir / SPEC_FILE
    try:
        meta = read_population_spec(spec)
        config = PopulationConfig.model_validate(meta.population)
    except (CorruptFile, ValueError) as exc:
        # ValidationError is a ValueError; its text spans lines, the first names the problem
        reason = (exc.problem if isinstance(exc, CorruptFile) else
                  str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise SimpipeError(f"{spec}: not a population spec this version reads ({reason}); "
                           "build it again with `simpipe population build CONFIG`") from None
    frame = pd.read_parquet(pop_dir)
    click.echo(f"population {pop_dir}: {len(frame):,} agents in {meta.n_partitions} "
               f"partitions, sampling {config.sampling}, seed {meta.seed}, "
               f"hash {meta.population_hash}")
    fmt = {"share": "{:.4f}".format, "requested": "{:.4f}".format}
    for name, spec in config.attributes.items():
        table, p = attribute_report(frame, config, name)
        given = f" given {spec.given}" if isinstance(spec, ConditionalAttribute) else ""
        test = "" if p is None else f"  chi-square p = {p:.4g}"
        click.echo(f"\n{name}{given}{test}")
        click.echo(table.to_string(index=False, formatters=fmt,
                                   float_format=lambda v: f"{v:.2f}"))
    persona = meta.persona
    if persona:
        click.echo(f"\npersonas: mode {persona['mode']}, sources {persona.get('sources')}")
        if persona.get("generator"):
            click.echo(f"generator {persona['generator']}, prompt hash {persona['prompt_hash']}")
    if "persona" in frame and samples > 0:
        rng = np.random.default_rng(0)
        picks = np.sort(rng.choice(len(frame), size=min(samples, len(frame)), replace=False))
        click.echo("\nsample personas:")
        for i in picks:
            row = frame.iloc[int(i)]
            source = row.get("persona_source", "")
            click.echo(f"- agent {row['agent_id']} ({source}):")
            click.echo(textwrap.indent(textwrap.fill(str(row["persona"]), 96), "    "))
