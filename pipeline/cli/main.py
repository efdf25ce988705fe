"""The ``simpipe`` command: a thin layer over the Python API.

Errors the user can fix are ``simpipe.core.errors.SimpipeError``s, printed by the group as one
line per problem with their exit status (``simpipe.cli.common``); nothing here prints a
traceback for a mistake the user can fix.

Commands import what they run inside their own function: ``simpipe --help`` and every
command load only what that command needs.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from simpipe.cli.common import SimpipeGroup, load, set_option
from simpipe.core.errors import AnswersFailed, RunInterrupted, RunTerminated, SimpipeError


@click.group(cls=SimpipeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="simpipe")
def main() -> None:
    """Very large LLM multi-agent simulations as a Dask batch pipeline."""


@main.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@click.option("--resume", is_flag=True, help="Continue an interrupted run with the same config.")
@click.option("--force", is_flag=True, help="Replace an existing run directory.")
@click.option("--cluster", "cluster_name", default=None, metavar="NAME",
              help="Run on a cluster started with `simpipe cluster up` (its servers too).")
@click.option("--emulate", is_flag=True,
              help="A dry run: emulated GPU servers replace the configured ones; ends with "
                   "an estimate of the real run.")
@set_option
def run(config_path: str, resume: bool, force: bool, cluster_name: str | None, emulate: bool,
        overrides: tuple[str, ...]) -> None:
    """Run the simulation described by CONFIG."""
    from simpipe.run.sigterm import Terminated  # keep startup light
    from simpipe.run.simulation import answers_failed, run_simulation

    if resume and force:
        raise SimpipeError("--resume and --force contradict each other: pick one")
    config = load(config_path, overrides)
    if config.experiment is not None:
        raise SimpipeError(f"{config_path} has an [experiment] table: run its grid with "
                           f"`simpipe experiment {shlex.quote(config_path)}` (`simpipe run` "
                           "runs one config)")
    try:
        result = run_simulation(config, resume=resume, force=force, emulate=emulate,
                                cluster_name=cluster_name)
    except KeyboardInterrupt as stop:
        # The runner has marked the run interrupted; finished partitions are on disk.
        again = " ".join(["simpipe run", shlex.quote(config_path),
                          *(f"--set {shlex.quote(item)}" for item in overrides),
                          *([f"--cluster {shlex.quote(cluster_name)}"] if cluster_name else []),
                          *(["--emulate"] if emulate else []), "--resume"])
        if isinstance(stop, Terminated):
            raise RunTerminated(f"terminated (SIGTERM); resume with: {again}") from None
        raise RunInterrupted(f"interrupted; resume with: {again}") from None
    click.echo(f"results: {result.run_dir}  ({result.wall_s:.1f} s)")
    failed = answers_failed(result)
    if failed:
        raise AnswersFailed(failed)


@main.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@set_option
def validate(config_path: str, overrides: tuple[str, ...]) -> None:
    """Check CONFIG and print the resolved settings: game, prompt options, back-end and
    model, population, cluster, and agent 0's round-1 prompt as an example."""
    from simpipe.cli.settings import resolved_settings
    from simpipe.config.population_mix import backend_summary
    from simpipe.run.server_grammar import slower_grammar
    from simpipe.run.server_slots import oversubscribed_slots

    config = load(config_path, overrides)
    click.echo(f"ok: {config_path}  (results hash {config.results_hash()}, "
               f"{config.population.size:,} agents in {config.population.n_partitions} partitions, "
               f"{config.game.rounds} rounds, backend {backend_summary(config.agents)})")
    click.echo(resolved_settings(config))
    for warning in (oversubscribed_slots(config), slower_grammar(config)):
        if warning is not None:
            click.echo(f"warning: {warning}")
    if config.experiment is not None:
        from simpipe.run.experiment import load_experiment

        experiment = load_experiment(config_path, overrides)  # every cell validated
        click.echo(f"experiment {experiment.name}: {len(experiment.cells)} cells in "
                   f"{experiment.folder}, each valid:")
        for cell in experiment.cells:
            values = ", ".join(f"{k}={v!r}" for k, v in cell.overrides.items())
            click.echo(f"  {cell.name}  ({values})")


@main.group()
def population() -> None:
    """Build and inspect populations."""


@population.command("build")
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@set_option
def population_build(config_path: str, overrides: tuple[str, ...]) -> None:
    """Sample the population of CONFIG into <output_dir>/<name>/population/."""
    from simpipe.run.console import Console
    from simpipe.run.population import build_population

    config = load(config_path, overrides)
    bar = Console().progress(config.population.n_partitions, "population")
    try:
        built = build_population(config, on_progress=lambda done, n: bar.update(1))
    finally:
        bar.close()
    click.echo(f"population: {built.path}  ({built.n_agents:,} agents, {built.wall_s:.1f} s)")


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--prompt", "agent_id", type=click.IntRange(min=0), default=None,
              metavar="AGENT_ID", help="Print the exact prompt this agent got instead.")
@click.option("--round", "round_number", type=click.IntRange(min=1), default=1,
              show_default=True, help="With --prompt: the round, counted from 1 as the "
                                      "console and the prompts count it.")
def show(run_dir: str, agent_id: int | None, round_number: int) -> None:
    """Print the summary of RUN_DIR, one line per round (and group); with --prompt, the
    prompt an agent got in a round."""
    if agent_id is not None:
        _show_prompt(run_dir, agent_id, round_number)
        return
    if round_number != 1:
        raise SimpipeError("--round goes with --prompt AGENT_ID: the summary shows every round")
    from simpipe.core.records import CorruptFile
    from simpipe.store.integrity import RESUME_REPAIRS
    from simpipe.store.layout import RunPaths
    from simpipe.store.results import read_ledger, read_summary
    from simpipe.store.states import RunState

    paths = RunPaths(Path(run_dir))
    if not paths.ledger.exists() and not paths.ledger.is_symlink():
        raise SimpipeError(f"{run_dir}: not a simpipe run directory (no run.json)")
    try:
        ledger = read_ledger(run_dir)
        game = ledger.game()
    except CorruptFile as exc:
        raise SimpipeError(f"{exc}; restore it from a copy (it records the run's config and "
                           "rounds)") from None
    total = "?" if ledger.rounds_total is None else ledger.rounds_total
    click.echo(f"run {ledger.name or paths.root.name}: {ledger.state}, "
               f"{ledger.rounds_done}/{total} rounds, {ledger.n_agents or 0:,} agents"
               + ("" if ledger.answers_source == "model" else
                  f", {ledger.answers_source} answers"))
    try:
        summary = read_summary(run_dir)
        # what --resume is for
        stopped = ledger.state not in (RunState.FINISHED, RunState.RUNNING)
        resume = ledger.resume_point(paths) if stopped else None
    except CorruptFile as exc:
        raise SimpipeError(f"{exc}; {RESUME_REPAIRS}") from None
    if resume is not None:
        r, left = resume
        click.echo(f"--resume continues with round {r + 1}: {len(left)} of "
                   f"{ledger.n_partitions} partitions to play")
    if summary.empty:
        click.echo("(no round finished yet)")
        return
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 20,
                           "display.max_rows", 60):
        click.echo(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if game.summary_note:
        click.echo(game.summary_note)


def _show_prompt(run_dir: str, agent_id: int, round_number: int) -> None:
    from simpipe.run.agent_prompt import rebuild_prompt

    shown = rebuild_prompt(run_dir, agent_id, round_number - 1)
    played = ("not played yet" if shown.tokens_in is None
              else f"tokens_in {shown.tokens_in:,} as the model counted"
              + (", drawn from a shared answer distribution" if shown.shared else ""))
    click.echo(f"# agent {shown.agent_id}, round {round_number} of {shown.rounds_total} "
               f"(group {shown.group_id}, partition {shown.partition}), {shown.style} prompt, "
               f"{played}; rebuilt from the run's files with the function the run used")
    click.echo(shown.text())


@main.group()
def bench() -> None:
    """Benchmarks: each prints one table and exits."""


class _AgentCounts(click.ParamType):
    """``10000,100000,1_000_000``: a comma list of agent counts, each at least 1."""

    name = "N[,N...]"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> list[int]:
        if isinstance(value, list):
            return value
        counts = []
        for item in str(value).split(","):
            text = item.strip().replace("_", "")
            if not text.isascii() or not text.isdigit() or int(text) < 1:
                self.fail(f"{item.strip()[:40]!r} is not a number of agents; expected whole "
                          "numbers of at least 1, comma-separated, e.g. 10000,100000", param, ctx)
            counts.append(int(text))
        return counts


@bench.command("scale")
@click.option("--agents", default="1000000", show_default=True, type=_AgentCounts(),
              help="Agents per case; a comma list runs several cases, e.g. 10000,100000,1000000.")
@click.option("--latency", default=0.0, show_default=True, type=click.FloatRange(0, 3600),
              help="Seconds each agent awaits.")
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--partitions", default=0, type=click.IntRange(min=0),
              help="Partitions per case (0: about 62,500 agents each).")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--threads", default=1, show_default=True, type=click.IntRange(min=1),
              help="Threads per worker.")
@click.option("--raw/--no-raw", default=True, show_default=True,
              help="Also time the agents without Dask, in this process.")
def bench_scale(agents: list[int], latency: float, rounds: int, partitions: int, workers: int,
                threads: int, raw: bool) -> None:
    """Scripted agents through the whole pipeline: wall time, agents/s, peak memory."""
    from simpipe.bench.scale import ScaleCase, format_table, run_case

    rows = []
    for n in agents:
        parts = partitions or max(2, round(n / 62_500))
        rows += run_case(ScaleCase(n, rounds, latency, min(parts, n), workers, threads), raw=raw)
    click.echo(format_table(rows))


@bench.command("fleet")
@click.option("--agents", default=100_000, show_default=True, type=click.IntRange(min=1))
@click.option("--rounds", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--nodes", default=1, show_default=True, type=click.IntRange(1, 16),
              help="Emulated nodes: one server job (--gpus GPUs) and --workers worker jobs each.")
@click.option("--gpus", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Emulated GPUs per node.")
@click.option("--profile", default="fast", show_default=True,
              help="Emulator timing profile: fast (the pipeline is the limit), a100-llama3-8b, "
                   "h100-llama3-8b.")
@click.option("--time-scale", default=1.0, show_default=True, type=click.FloatRange(min=0.001),
              help="The emulated GPUs run this many times faster than real ones.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 16),
              help="Worker jobs (one process each) per node.")
@click.option("--threads", default=2, show_default=True, type=click.IntRange(1, 16),
              help="Partitions a worker plays at once.")
@click.option("--partitions", default=0, type=click.IntRange(min=0),
              help="Partitions (0: at least 4 per worker thread, at most 50,000 agents each).")
@click.option("--max-concurrency", default=0, type=click.IntRange(min=0),
              help="Requests in flight per endpoint per worker process (0: auto).")
@click.option("--worker-memory", default="3GB", show_default=True, help="Per worker job.")
@click.option("--port", default=0, type=click.IntRange(0, 65535),
              help="First server port (0: the first free range from 19300).")
@click.option("--kill-server-at", default=None, type=click.FloatRange(min=0.0),
              help="scancel the last node's server job this many seconds after round 1 starts.")
@click.option("--weak-scaling", is_flag=True,
              help="Run 1, 2 and 4 nodes with --agents-per-gpu agents per emulated GPU.")
@click.option("--agents-per-gpu", default=10_000, show_default=True, type=click.IntRange(min=1))
@click.option("--keep", default=None, metavar="DIR",
              help="Keep the runs under DIR (default: a temporary directory, removed).")
def bench_fleet(agents: int, rounds: int, nodes: int, gpus: int, profile: str,
                time_scale: float, workers: int, threads: int, partitions: int,
                max_concurrency: int, worker_memory: str, port: int,
                kill_server_at: float | None, weak_scaling: bool, agents_per_gpu: int,
                keep: str | None) -> None:
    """The GPU path at scale on the local SLURM: emulated TGI servers and Dask workers as
    SLURM jobs; per round: wall time, the fleet's ideal time and busy share, pipeline CPU."""
    from simpipe.bench.fleet import FleetCase, run_bench

    # Bad options, config, SLURM, servers, cluster: SimpipeErrors, one line each.
    case = FleetCase(agents, rounds, nodes, gpus, profile, time_scale, workers, threads,
                     partitions, max_concurrency, worker_memory, port, kill_server_at)
    run_bench(case, weak_scaling=weak_scaling, agents_per_gpu=agents_per_gpu, keep=keep,
              echo=click.echo, log=lambda line: click.echo(line, err=True))


@bench.command("engine")
@click.option("--agents", default=256, show_default=True, type=click.IntRange(min=1),
              help="Prompts (agents) per row.")
@click.option("--parallel", default=32, show_default=True, type=click.IntRange(1, 512),
              help="llama.cpp slots.")
def bench_engine(agents: int, parallel: int) -> None:
    """The embedded engine alone vs. the pipeline's llamacpp and openai back-ends."""
    from simpipe.bench.engine import format_table, run_engine_bench

    click.echo(format_table(run_engine_bench(agents, parallel)))


@bench.command("share")
@click.option("--case", type=click.Choice(["default", "paper", "openai", "emulate"]),
              default="default", show_default=True,
              help="default: the embedded model (1M x 2); paper: 1,000 x 5 of the paper's "
                   "population; openai: that through the openai back-end to a llama.cpp "
                   "server; emulate: 1M x 3 on emulated vLLM servers with and without sharing.")
@click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False),
              help="Run this config (output goes to a temporary folder) instead of the "
                   "default: the paper's population as template personas, embedded model.")
@click.option("--agents", default=None, type=click.IntRange(min=2),
              help="Agents (default config only; default per --case: 1,000,000, or 1,000 "
                   "for paper and openai).")
@click.option("--rounds", default=None, type=click.IntRange(min=1),
              help="Rounds (default config only; default per --case: 2, 5 for paper and "
                   "openai, 3 for emulate).")
@click.option("--sample", default=64, show_default=True, type=click.IntRange(min=1),
              help="Agents in the per-agent reference row.")
@click.option("--servers", default=32, show_default=True, type=click.IntRange(1, 256),
              help="Emulated GPU servers (--case emulate).")
@click.option("--time-scale", default=20.0, show_default=True, type=click.FloatRange(min=1.0),
              help="Emulated time runs this much faster than real time (--case emulate).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a key of --config, or of the default config (after --agents "
                   "and --rounds), e.g. --set agents.max_tokens=4 (repeatable).")
def bench_share(case: str, config_path: str | None, agents: int | None, rounds: int | None,
                sample: int, servers: int, time_scale: float,
                overrides: tuple[str, ...]) -> None:
    """Shared answer distributions vs one call per agent: agents/s, model calls, memory;
    on emulated GPU servers, the GPU-seconds with and without sharing."""
    from simpipe.bench.share import CASES, default_config, format_table, run_share_bench

    agents = agents or CASES[case][0]
    rounds = rounds or CASES[case][1]
    if case == "emulate" and (config_path or overrides):
        raise click.UsageError("--case emulate builds its own config; drop --config and --set")
    # The output folder is replaced by a temporary one in either case.
    config = (load(config_path, overrides) if config_path
              else None if case == "emulate"
              else default_config(agents, rounds, Path("results"), overrides))
    click.echo(format_table(run_share_bench(config, agents, rounds, sample, case=case,
                                            servers=servers, time_scale=time_scale)))


@bench.command("invariance")
@click.option("--probe-prompts", default=4, show_default=True, type=click.IntRange(1, 32),
              help="Distinct round-3 prompts whose top-20 log-probabilities are compared.")
@click.option("--sample-requests", default=16, show_default=True, type=click.IntRange(1, 256),
              help="Sampled round-3 requests compared lone vs batched.")
@click.option("--throughput-prompts", default=48, show_default=True,
              type=click.IntRange(min=0), help="Prompts per throughput run (0: skip).")
@click.option("--repeats", default=2, show_default=True, type=click.IntRange(1, 10),
              help="Interleaved runs of each throughput mode.")
def bench_invariance(probe_prompts: int, sample_requests: int, throughput_prompts: int,
                     repeats: int) -> None:
    """Which llama.cpp results stay bit-identical under batching, and what each mode costs."""
    from simpipe.bench.invariance import run_invariance

    run_invariance(probe_prompts=probe_prompts, sample_requests=sample_requests,
                   throughput_prompts=throughput_prompts, repeats=repeats,
                   echo=lambda line: click.echo(line))


@bench.command("client")
@click.option("--requests", "n_requests", default=20000, show_default=True,
              type=click.IntRange(min=1))
@click.option("--concurrency", default=64, show_default=True, type=click.IntRange(min=1),
              help="Requests in flight.")
def bench_client(n_requests: int, concurrency: int) -> None:
    """HTTP client cost of the tgi and openai back-ends against a server answering at once,
    and the GPU emulator's server cost (fast profile)."""
    from simpipe.bench.client import format_table, run_client_bench

    click.echo(format_table(run_client_bench(n_requests, concurrency=concurrency)))


from simpipe.cli.report import report_command  # noqa: E402 - light: click only

main.add_command(report_command)

from simpipe.cli.experiment import experiment_command  # noqa: E402 - light: click only

main.add_command(experiment_command)

from simpipe.cli.population import population_show  # noqa: E402 - light: click only

population.add_command(population_show)

from simpipe.cli.cluster import register as _register_cluster  # noqa: E402 - light: click only

_register_cluster(main)

from simpipe.cli.ui import ui_command  # noqa: E402 - light: click only

main.add_command(ui_command)

from simpipe.cli.engine import engine_group  # noqa: E402 - light: click only

main.add_command(engine_group)
