"""Where a run executes (``simpipe.run.executor``): an executor entered once holds one
cluster for any number of runs and closes it when the with-block ends; its config swaps
endpoints and sections through validated copies."""

from __future__ import annotations

from pathlib import Path

import pytest
from distributed import Client

import simpipe
from simpipe.cluster.batch import BatchOptions
from simpipe.cluster.config import (
    AddressClusterConfig,
    LocalClusterConfig,
    ServersConfig,
    SlurmClusterConfig,
)
from simpipe.cluster.slurm import NotSlurm
from simpipe.cluster.workers import LocalWorkers
from simpipe.config.model import ConfigError
from simpipe.core.errors import SimpipeError
from simpipe.run.batch_task import write_batch_script
from simpipe.run.console import Console
from simpipe.run.executor import ExecutorError, executor_for
from simpipe.store.results import read_ledger, read_rounds

from support import small_config

QUIET = Console(quiet=True)


def _named(config: simpipe.Config, name: str) -> simpipe.Config:
    return config.with_sections(run=config.run.model_copy(update={"name": name}))


def test_two_runs_inside_one_entered_executor_share_its_cluster_which_closes_after(
        tmp_path: Path) -> None:
    first = small_config(tmp_path).with_sections(
        cluster=LocalClusterConfig(workers=1, dashboard_address=""))
    second = _named(first, "second").with_sections(game=first.game.model_copy(
        update={"rounds": 2}))
    with executor_for(first, say=QUIET.line) as executor:
        assert isinstance(executor.workers, LocalWorkers)  # the kind's executor
        client = executor.client
        cluster = client.cluster
        a = simpipe.run_simulation(first, executor=executor, console=QUIET)
        b = simpipe.run_simulation(second, executor=executor, console=QUIET)
        assert executor.client is client  # the runs left it up
        scheduler = client.scheduler.address
    assert [read_ledger(r.run_dir).scheduler for r in (a, b)] == [scheduler, scheduler]
    assert [read_ledger(r.run_dir).state for r in (a, b)] == ["finished", "finished"]
    assert len(read_rounds(a.run_dir)) == 3 * 600 and len(read_rounds(b.run_dir)) == 2 * 600
    assert executor.client is None and client.status == "closed"
    assert cluster.status.name == "closed"
    with pytest.raises((OSError, TimeoutError)):
        Client(scheduler, timeout="2s")


def test_a_run_outside_its_executor_or_with_two_places_to_run_is_refused(
        tmp_path: Path, dask_client: Client) -> None:
    config = small_config(tmp_path)
    executor = executor_for(config, say=QUIET.line)
    with pytest.raises(ExecutorError, match="not entered"):
        executor.run_config(config)
    with pytest.raises(SimpipeError, match="executor= says where the run executes, which "
                                           "client= would replace"):
        simpipe.run_simulation(config, executor=executor, client=dask_client, console=QUIET)
    assert not config.run_dir.exists()


def test_an_executor_points_a_runs_config_at_its_cluster_and_servers(
        tmp_path: Path, dask_client: Client) -> None:
    address = dask_client.scheduler.address
    config = small_config(tmp_path, agents={"backend": "tgi"}).with_sections(
        cluster=AddressClusterConfig(address=address))
    servers = ServersConfig(kind="emulated", per_node=2,
                            emulated={"profile": "fast", "gpus_per_process": 2})
    own = config.with_sections(cluster=AddressClusterConfig(address=address, servers=servers))
    with executor_for(own, say=QUIET.line) as executor:
        assert len(executor.endpoints) == 2
        assert executor.config.agents.tgi.endpoints == executor.endpoints
        other = executor.run_config(_named(config, "other"))
        assert other.cluster == executor.config.cluster
        assert other.agents.tgi.endpoints == executor.endpoints
        assert other.results_hash() == _named(config, "other").results_hash()


def test_with_endpoints_is_a_validated_copy(tmp_path: Path) -> None:
    config = small_config(tmp_path, agents={"backend": "tgi"})
    urls = ["http://10.0.0.1:8300", "http://10.0.0.2:8300"]
    swapped = config.with_endpoints("tgi", urls)
    assert swapped.agents.tgi.endpoints == urls
    assert config.agents.tgi.endpoints != urls  # the original is left as it was
    assert swapped.results_hash() == config.results_hash()
    with pytest.raises(ConfigError, match=r"^servers: agents\.tgi\.endpoints: .*ftp://x"):
        config.with_endpoints("tgi", ["ftp://x"])
    # The copy is checked as a whole: a section that fits alone but not with the others.
    public_goods = small_config(tmp_path, game={"kind": "public_goods", "group_size": 5})
    with pytest.raises(ConfigError, match=r"^config: game: .*does not divide into groups"):
        public_goods.with_sections(population=public_goods.population.model_copy(
            update={"size": 601}))


def test_write_batch_script_returns_the_script_and_makes_the_job_log_folder(
        tmp_path: Path) -> None:
    config = small_config(tmp_path).with_sections(cluster=SlurmClusterConfig())
    script = write_batch_script(config, BatchOptions(str(tmp_path / "c.toml")),
                                tmp_path / "run.sbatch")
    assert script.path == tmp_path / "run.sbatch" and script.path.read_text() == script.text
    assert f"#SBATCH --job-name=simpipe-{config.run.name}" in script.text.splitlines()
    assert (config.run_dir / "logs" / "slurm").is_dir()
    assert script.run_dir == config.run_dir
    printed = write_batch_script(config, BatchOptions("/c.toml"), "-")
    assert printed.path is None and "batch-task /c.toml" in printed.text
    with pytest.raises(NotSlurm, match='simpipe sbatch needs cluster.kind = "slurm"'):
        write_batch_script(small_config(tmp_path), BatchOptions("/c.toml"))
