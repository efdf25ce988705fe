"""The ``simpipe experiment`` command; the run layer is imported when it runs, so that
``simpipe --help`` stays fast."""

from __future__ import annotations

import shlex

import click

from simpipe.cli.common import set_option
from simpipe.core.errors import RunInterrupted


@click.command("experiment")
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True,
              help="Replace every cell's run (start the experiment over).")
@click.option("--cluster", "cluster_name", default=None, metavar="NAME",
              help="Run the cells on a cluster started with `simpipe cluster up`.")
@set_option
def experiment_command(config_path: str, force: bool, cluster_name: str | None,
                       overrides: tuple[str, ...]) -> None:
    """Run the grid of CONFIG's [experiment] table, one run per cell, on one cluster.

    Every cell's config is checked before anything starts. Running it again resumes:
    finished cells are skipped, interrupted ones continue. `simpipe report` on the
    experiment folder compares the cells.
    """
    from simpipe.run.experiment import load_experiment, run_experiment  # keep startup light

    experiment = load_experiment(config_path, overrides)
    try:
        result = run_experiment(experiment, force=force, cluster_name=cluster_name)
    except KeyboardInterrupt:
        # The cell's run and experiment.json are marked interrupted; rerunning resumes.
        again = " ".join(["simpipe experiment", shlex.quote(config_path),
                          *(f"--set {shlex.quote(item)}" for item in overrides),
                          *([f"--cluster {shlex.quote(cluster_name)}"] if cluster_name else [])])
        raise RunInterrupted(f"interrupted; resume with: {again}") from None
    click.echo(f"results: {result.folder}  ({len(result.cells)} cells, {result.wall_s:.1f} s); "
               f"compare them: simpipe report {shlex.quote(str(result.folder))}")
