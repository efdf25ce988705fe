"""The generated job scripts for the GPU examples (plain text checks, no SLURM needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from dask_jobqueue.slurm import SLURMJob

from simpipe.cluster.batch import BatchOptions, batch_script
from simpipe.cluster.config import SlurmClusterConfig
from simpipe.cluster.connect import slurm_cluster_kwargs
from simpipe.cluster.endpoints import prefer_local, split_local
from simpipe.cluster.servers import server_command, server_job_script
from simpipe.cluster.state import run_target
from simpipe.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]


def _worker_script(cluster: SlurmClusterConfig) -> str:
    kwargs = slurm_cluster_kwargs(cluster)
    kwargs.pop("scheduler_options")
    return SLURMJob(scheduler="tcp://10.0.0.1:8786", name="w", **kwargs).job_script()


def test_tgi_example_scripts() -> None:
    cluster = load_config(REPO / "examples/slurm-gpu-tgi.toml").cluster
    worker = _worker_script(cluster)
    assert "#SBATCH -p gpu" in worker
    assert "#SBATCH -t 04:00:00" in worker
    assert "#SBATCH --exclusive=user" in worker
    assert "--nworkers 8" in worker and "--interface ib0" in worker
    assert "--lifetime 13380s --lifetime-stagger 300s" in worker  # below the 4 h walltime
    assert "module load python/3.11" in worker

    server = server_job_script(cluster, "c", 5, "/logs")
    assert "#SBATCH --gres=gpu:1" in server
    assert "#SBATCH --partition=gpu" in server
    assert "#SBATCH --cpus-per-task=4" in server
    assert "#SBATCH --job-name=simpipe-c-server" in server
    assert ("exec apptainer exec --nv --bind $HOME/.cache/huggingface:/data "
            "docker://ghcr.io/huggingface/text-generation-inference:2.4.1 "
            "text-generation-launcher --model-id meta-llama/Meta-Llama-3-8B-Instruct "
            "--hostname 0.0.0.0 --port 8305 --num-shard 1") in server

    batch = batch_script(cluster, BatchOptions("/cfg.toml", ("game.rounds=2",), nodes=4,
                                               gpus_per_node=8, workers_per_node=8))
    assert "#SBATCH --nodes=4" in batch
    assert "#SBATCH --gres=gpu:8" in batch
    assert "#SBATCH --ntasks=34" in batch  # 32 workers + scheduler + client
    assert "--ntasks-per-node=8 --ntasks=32" in batch  # one server per GPU
    assert "CUDA_VISIBLE_DEVICES" in batch
    assert "batch-task /cfg.toml --set game.rounds=2" in batch


def test_vllm_example_scripts() -> None:
    cluster = load_config(REPO / "examples/slurm-gpu-vllm.toml").cluster
    server = server_job_script(cluster, "v", 0)
    assert "#SBATCH --gres=gpu:2" in server
    assert "#SBATCH --mem=98304M" in server
    assert "module load cuda/12.4" in server
    assert ("vllm serve meta-llama/Meta-Llama-3-8B-Instruct --host 0.0.0.0 --port 8400 "
            "--tensor-parallel-size 2") in server
    batch = batch_script(cluster, BatchOptions("/c.toml", nodes=2, gpus_per_node=8))
    assert "--ntasks-per-node=4" in batch  # 8 GPUs / 2 per server


def test_llamacpp_template_and_custom() -> None:
    cfg = SlurmClusterConfig(servers={"kind": "llamacpp", "cpus_per_server": 2})
    cmd = server_command(cfg.servers, 9000, python="/py")
    assert cmd == "/py -m simpipe.inference.llamacpp_server --host 0.0.0.0 --port 9000 --threads 2"
    custom = SlurmClusterConfig(servers={"kind": "custom",
                                                  "command": "srv --p {port} --m {model}"})
    assert server_command(custom.servers, 1) == "srv --p 1 --m"


@pytest.mark.parametrize(("walltime", "expected"), [
    ("00:10:00", ["--lifetime", "510s", "--lifetime-stagger", "30s"]),
    ("1-00:00:00", ["--lifetime", "81780s", "--lifetime-stagger", "300s"]),
])
def test_lifetime_below_walltime(walltime: str, expected: list[str]) -> None:
    assert SlurmClusterConfig(walltime=walltime).worker_lifetime_args() == expected


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[cluster]\nkind = "slurm"\nwalltime = "00:10:00"\nworker_lifetime = "20m"\n')
    with pytest.raises(ConfigError, match="cluster.worker_lifetime"):
        load_config(cfg)
    cfg.write_text('[cluster]\nkind = "slurm"\njobs = 2\nadapt = { maximum = 4 }\n')
    with pytest.raises(ConfigError, match="cluster.jobs or cluster.adapt"):
        load_config(cfg)
    cfg.write_text('[cluster]\nkind = "slurm"\n[cluster.servers]\nkind = "tgi"\n')
    with pytest.raises(ConfigError, match="model"):
        load_config(cfg)


def test_endpoint_preference() -> None:
    names = frozenset({"node1", "10.0.0.1"})
    eps = ["http://node2:8300", "http://10.0.0.1:8301", "http://node1:8300", "http://x:1"]
    assert split_local(eps, names) == (eps[1:3], [eps[0], eps[3]])
    assert prefer_local(eps, names) == [eps[1], eps[2], eps[0], eps[3]]


def test_an_emulated_node_prefers_its_own_servers_on_one_machine() -> None:
    """Every server here is on 127.0.0.1; a process told it is emulated node 2 prefers
    node 2's servers, and its endpoint pool falls back to the others."""
    from simpipe.cluster.endpoints import emulate_node, is_local
    from simpipe.inference.http import EndpointPool
    from simpipe.inference.settings import TgiSettings

    eps = [f"http://127.0.0.1:{port}" for port in (8300, 8301, 8302, 8303)]
    assert all(is_local(e) for e in eps)
    emulate_node(eps[2:])
    try:
        assert [is_local(e) for e in eps] == [False, False, True, True]
        assert prefer_local(eps) == [eps[2], eps[3], eps[0], eps[1]]
        pool = EndpointPool(TgiSettings(endpoints=eps, max_concurrency=1))
        assert {pool._pick(None).name for _ in range(4)} == set(eps[2:])
        for ep in pool._endpoints[2:]:
            ep.load = 1  # both saturated: another node's server takes the overflow
        assert pool._pick(None).name in eps[:2]
    finally:
        emulate_node(None)
    assert all(is_local(e) for e in eps)


def test_run_target() -> None:
    state = {"name": "c", "state": "ready", "scheduler": "tcp://1.2.3.4:5",
             "endpoint_backend": "openai",
             "servers": [{"url": "http://a:1", "healthy": True}, {"url": "http://b:2",
                                                                  "healthy": False}]}
    assert run_target(state, "openai") == ("tcp://1.2.3.4:5", ["http://a:1"])
    assert run_target(state, "scripted") == ("tcp://1.2.3.4:5", [])
