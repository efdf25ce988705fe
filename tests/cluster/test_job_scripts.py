"""The generated job scripts for the GPU examples (plain text checks, no SLURM needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from dask_jobqueue.slurm import SLURMJob

from simpipe.cluster.batch import BatchOptions, batch_script
from simpipe.cluster.config import SlurmClusterConfig, memory_mib
from simpipe.cluster.connect import slurm_cluster_kwargs
from simpipe.cluster.servers import server_command, server_job_script
from simpipe.cluster.state import run_target
from simpipe.config.model import ConfigError, load_config
from simpipe.inference.http.endpoints import emulate_node, is_local

from support import one_error_line, simpipe_cli

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


def test_batch_invariant_vllm_servers_start_with_vllms_switch(tmp_path: Path) -> None:
    # Same seed, same guesses on GPU servers: the job exports vLLM's documented switch
    # after the prologue (a `module load` cannot undo it) and before the server starts.
    cluster = load_config(REPO / "examples/slurm-gpu-vllm.toml",
                          overrides=["cluster.servers.batch_invariant=true"]).cluster
    lines = server_job_script(cluster, "v", 0).splitlines()
    export = lines.index("export VLLM_BATCH_INVARIANT=1")
    assert lines.index("module load cuda/12.4") < export < len(lines) - 1
    assert lines[-1].startswith("exec vllm serve ")
    plain = load_config(REPO / "examples/slurm-gpu-vllm.toml").cluster
    assert "VLLM_BATCH_INVARIANT" not in server_job_script(plain, "v", 0)
    # A kind without such a mode refuses the key, naming the kinds that have one.
    cfg = tmp_path / "c.toml"
    cfg.write_text('[cluster]\nkind = "slurm"\n[cluster.servers]\nkind = "tgi"\n'
                   'model = "m"\nbatch_invariant = true\n')
    with pytest.raises(ConfigError, match="cluster.servers.*no batch-invariant mode.*vllm"):
        load_config(cfg)


def test_llamacpp_template_and_custom() -> None:
    cfg = SlurmClusterConfig(servers={"kind": "llamacpp", "cpus_per_server": 2})
    cmd = server_command(cfg.servers, 9000, python="/py")
    assert cmd == "/py -m simpipe.servers.llamacpp_server --host 0.0.0.0 --port 9000 --threads 2"
    custom = SlurmClusterConfig(servers={"kind": "custom",
                                                  "command": "srv --p {port} --m {model}"})
    assert server_command(custom.servers, 1) == "srv --p 1 --m"


@pytest.mark.parametrize(("text", "mib"), [
    ("4GiB", 4096), ("4 gib", 4096), ("4GB", 3815), ("4G", 3815), ("5e9", 4769),
    ("512 MB", 489), ("1.5TiB", 1_572_864), ("100", 1),
])
def test_memory_is_read_as_dask_reads_it_rounded_up_to_whole_mib(text: str, mib: int) -> None:
    """One reading of every memory key: what the config accepts, a job script can use."""
    assert memory_mib(text, "cluster.servers.memory") == mib
    cluster = SlurmClusterConfig(memory=text, servers={"kind": "llamacpp", "memory": text})
    assert f"#SBATCH --mem={mib}M\n" in server_job_script(cluster, "c", 0)
    # 1 worker task + scheduler + client, each with cluster.memory; no servers
    batch = batch_script(cluster.model_copy(update={"servers": SlurmClusterConfig().servers}),
                         BatchOptions("/c.toml"))
    assert f"#SBATCH --mem={3 * mib}M\n" in batch
    assert f"#SBATCH --mem={mib}M\n" in batch_script(cluster, BatchOptions("/c.toml",
                                                                          memory=text))


def test_a_memory_option_that_is_no_amount_is_one_line_naming_the_option(
        tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[cluster]\nkind = "slurm"\n')
    script = tmp_path / "s.sbatch"
    args = ("sbatch", str(cfg), "--job-log", str(tmp_path / "j.out"), "--output", str(script))
    line = one_error_line(simpipe_cli(*args, "--mem", "lots"))
    assert line == ("error: --mem = 'lots': expected an amount of memory such as \"4GiB\", "
                    "\"2GB\" or \"512MB\"")
    assert not script.exists()
    assert simpipe_cli(*args, "--mem", "5e9").returncode == 0
    assert "#SBATCH --mem=4769M\n" in script.read_text()


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


def test_which_endpoints_are_on_this_node() -> None:
    names = frozenset({"node1", "10.0.0.1"})
    local = ["http://10.0.0.1:8301", "http://node1:8300", "http://node1.cluster.example:1",
             "http://127.0.0.1:2", "http://[::1]:3"]
    remote = ["http://node2:8300", "http://10.0.0.2:1", "http://x:1"]
    assert [is_local(e, names) for e in local + remote] == [True] * 5 + [False] * 3


def test_the_endpoint_pool_prefers_this_nodes_server_while_it_has_room() -> None:
    """What inference.endpoints' docstring promises: the pool orders endpoints itself (this
    node's first, least loaded), the other nodes' servers take the overflow and fail-over."""
    from simpipe.inference.http.backend import EndpointPool
    from simpipe.inference.settings import TgiSettings

    remote, local = "http://node-elsewhere.invalid:8300", "http://127.0.0.1:8301"
    pool = EndpointPool(TgiSettings(endpoints=[remote, local], max_concurrency=2))
    assert [pool._pick(None).name for _ in range(4)] == [local] * 4
    here = pool._endpoints[1]
    here.load = 2  # saturated
    assert pool._pick(None).name == remote
    here.load, here.down_until = 0, float("inf")  # marked down
    assert pool._pick(None).name == remote


def test_an_emulated_node_prefers_its_own_servers_on_one_machine() -> None:
    """Every server here is on 127.0.0.1; a process told it is emulated node 2 prefers
    node 2's servers, and its endpoint pool falls back to the others."""
    from simpipe.inference.http.backend import EndpointPool
    from simpipe.inference.settings import TgiSettings

    eps = [f"http://127.0.0.1:{port}" for port in (8300, 8301, 8302, 8303)]
    assert all(is_local(e) for e in eps)
    emulate_node(eps[2:])
    try:
        assert [is_local(e) for e in eps] == [False, False, True, True]
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
    assert run_target(state, "openai", True) == ("tcp://1.2.3.4:5", ["http://a:1"])
    assert run_target(state, "scripted", False) == ("tcp://1.2.3.4:5", [])
