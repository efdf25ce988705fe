"""`--emulate` on the GPU examples for SLURM sites that fit, do not fit, or do not answer
(sites described, not probed: no SLURM needed), and the emulator job scripts."""

from __future__ import annotations

from pathlib import Path

import pytest

from simpipe.cluster.servers import server_job_script
from simpipe.cluster.slurm import Partition
from simpipe.config import ConfigError, load_config
from simpipe.run.emulate import EmulateError, Site, emulate_config

REPO = Path(__file__).resolve().parents[2]
TGI = REPO / "examples/slurm-gpu-tgi.toml"
VLLM = REPO / "examples/slurm-gpu-vllm.toml"

#: this project's workstation: one 2-CPU node that is this machine
SMALL = Site(None, [Partition("debug", True, 2, 20489, "vm")], local_nodes=True,
             interfaces=frozenset({"lo", "eth0"}))
#: a GPU cluster the config was written for
BIG = Site(None, [Partition("gpu", False, 64, 512_000, "g[01-04]")], local_nodes=False)
NONE = Site("sinfo not found (SLURM client commands are not installed)")


def test_tgi_example_on_a_small_slurm_keeps_count_and_protocol_and_fits_the_workers():
    config, notes = emulate_config(load_config(TGI), SMALL)
    servers, cluster = config.cluster.servers, config.cluster
    assert (servers.kind, servers.count, servers.endpoint_backend) == ("emulated", 32, "tgi")
    emu = servers.emulated
    assert emu.protocol == "tgi" and emu.model_id == "meta-llama/Meta-Llama-3-8B-Instruct"
    # TGI's own flags from extra_args carry over
    assert emu.params == {"max_concurrent_requests": 512, "max_batch_prefill_tokens": 16384}
    assert (servers.container, servers.extra_args, servers.job_extra_directives) == (
        "none", "", [])
    assert servers.gpus_per_server == 1  # what GPU-hours count
    assert (cluster.kind, cluster.queue, cluster.interface) == ("slurm", None, "lo")
    assert "interface" not in cluster.scheduler_options
    assert (cluster.jobs, cluster.processes, cluster.job_script_prologue) == (2, 1, [])
    assert emu.gpus_per_process == 32  # one emulator process on two cores
    assert config.run.name == "paper-tgi-1m-emulated"
    assert notes[0].startswith("--emulate: 32 emulated a100-llama3-8b GPU server(s) with TGI "
                               "routes replace cluster.servers (tgi)")
    assert "no partition 'gpu'" in notes[1] and "no interface 'ib0' here" in notes[1]


def test_tgi_example_on_the_cluster_it_was_written_for_keeps_the_workers():
    config, notes = emulate_config(load_config(TGI), BIG)
    cluster = config.cluster
    assert (cluster.queue, cluster.interface, cluster.jobs, cluster.processes) == (
        "gpu", "ib0", 4, 8)
    assert cluster.servers.emulated.gpus_per_process == 8  # one emulator job per node
    assert len(notes) == 1
    script = server_job_script(cluster, "c", 3)
    assert "#SBATCH --gres" not in script and "#SBATCH --partition=gpu" in script
    assert "source $HOME/simpipe/.venv/bin/activate" in script  # the workers' environment
    assert "--port 8324 --gpus 8 --profile a100-llama3-8b" in script
    assert "apptainer" not in script


def test_without_slurm_workers_run_locally_and_emulators_on_this_machine():
    config, notes = emulate_config(load_config(TGI), NONE)
    assert config.cluster.kind == "local" and config.cluster.servers.kind == "emulated"
    assert "no SLURM answers (sinfo not found" in notes[1]
    assert "the emulated servers run on this machine" in notes[2]


def test_vllm_example_gets_openai_routes_its_flags_and_a_tensor_parallel_note():
    config, notes = emulate_config(load_config(VLLM), SMALL)
    servers = config.cluster.servers
    assert (servers.count, servers.endpoint_backend) == (8, "openai")
    emu = servers.emulated
    assert emu.protocol == "openai" and emu.params["max_batch"] == 512
    assert emu.params["max_concurrent_requests"] >= 1_000_000  # vLLM never answers 429
    assert any("tensor parallelism over gpus_per_server = 2 is not modelled" in n
               for n in notes)


def test_user_settings_win_over_the_server_flags():
    config = load_config(TGI, ["cluster.servers.emulated.params.max_concurrent_requests=64",
                               'cluster.servers.emulated.profile="h100-llama3-8b"',
                               "cluster.servers.emulated.time_scale=10"])
    emu = emulate_config(config, BIG)[0].cluster.servers.emulated
    assert emu.params["max_concurrent_requests"] == 64
    assert (emu.profile, emu.time_scale) == ("h100-llama3-8b", 10)


def test_endpoints_without_servers_become_emulated_servers(tmp_path):
    config = load_config(REPO / "examples/scripted.toml", [
        "agents.backend=openai", 'agents.openai.endpoints=["http://a:1", "http://b:1", '
        '"http://c:1"]', 'agents.openai.model="m"'])
    emu, _ = emulate_config(config, SMALL)
    servers = emu.cluster.servers
    assert (servers.count, servers.emulated.protocol, servers.emulated.model_id) == (
        3, "openai", "m")


def test_a_config_without_http_servers_cannot_be_emulated():
    with pytest.raises(EmulateError, match="agents.backend = 'scripted' uses none"):
        emulate_config(load_config(REPO / "examples/scripted.toml"), SMALL)


def test_a_bad_profile_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"cluster\.servers\.emulated.*unknown emulator "
                                          r"profile 'h200'"):
        load_config(TGI, ['cluster.servers.emulated.profile="h200"'])


def test_emulator_jobs_split_the_servers_over_processes():
    config = load_config(TGI, ['cluster.servers.kind="emulated"', "cluster.servers.nodes=1",
                               "cluster.servers.per_node=10",
                               "cluster.servers.emulated.gpus_per_process=4"])
    cluster = config.cluster
    scripts = [server_job_script(cluster, "c", j) for j in range(3)]
    assert ["--port 8300 --gpus 4" in scripts[0], "--port 8304 --gpus 4" in scripts[1],
            "--port 8308 --gpus 2" in scripts[2]] == [True] * 3
    assert "ports 8308-8309" in scripts[2]
