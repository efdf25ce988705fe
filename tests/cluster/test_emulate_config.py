"""`--emulate` on the GPU examples for SLURM sites that fit, do not fit, or do not answer
(sites described, not probed: no SLURM needed), and the emulator job scripts."""

from __future__ import annotations

import shlex
from pathlib import Path

import psutil
import pytest

from simpipe.cluster.servers import server_command, server_job_script
from simpipe.cluster.slurm import Partition
from simpipe.config.model import ConfigError, load_config
from simpipe.run.emulate import EmulateError, Site, emulate_config, probe_site
from simpipe.servers.emulator import READY_LINE
from simpipe.servers.process import ServerProcess

REPO = Path(__file__).resolve().parents[2]
TGI = REPO / "examples/slurm-gpu-tgi.toml"
VLLM = REPO / "examples/slurm-gpu-vllm.toml"

#: this project's workstation: one 2-CPU node that is this machine, at 127.0.0.1
SMALL = Site(None, [Partition("debug", True, 2, 20489, "vm")], local_nodes=True,
             interfaces=frozenset({"lo", "eth0"}), node_addresses=frozenset({"127.0.0.1"}))
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
    # vLLM never answers 429, but an emulator's queue is bounded: the largest it takes.
    assert emu.params["max_concurrent_requests"] == 100_000
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


@pytest.mark.parametrize(("setting", "expected"), [
    ("params.step_base_s=nan", "cluster.servers.emulated: emulator parameter step_base_s = nan: "
                               "expected 0 or seconds from 1e-09 to 86400"),
    ("params.step_base_s=inf", "emulator parameter step_base_s = inf"),
    ("params.max_batch=inf", "emulator parameter max_batch = inf: expected an integer from 1 "
                             "to 65,536"),
    ("params.max_concurrent_requests=1e6", "max_concurrent_requests = 1000000.0: expected an "
                                           "integer from 1 to 100,000"),
    ("time_scale=1e-320", "cluster.servers.emulated.time_scale = 1e-320: Input should be "
                          "greater than or equal to 0.001"),
    ("time_scale=inf", "cluster.servers.emulated.time_scale = inf: Input should be a finite"),
    ("gpus_per_process=100000", "gpus_per_process = 100000: Input should be less than or "
                                "equal to 1024"),
])
def test_emulator_settings_that_are_not_finite_or_absurd_fail_validation(setting, expected):
    """They passed `simpipe validate`; the run then never got answers, or ended in an
    OverflowError or a timer traceback."""
    with pytest.raises(ConfigError) as err:
        load_config(TGI, [f"cluster.servers.emulated.{setting}"])
    lines = str(err.value).splitlines()
    assert len(lines) == 1 and expected in lines[0]


def _listening(pid: int) -> set[str]:
    return {c.laddr.ip for c in psutil.Process(pid).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN}


def test_emulators_listen_on_loopback_when_every_node_is_this_machine_at_loopback():
    """They listened on 0.0.0.0 (the configured host of the real servers) on a
    loopback-only cluster: reachable from every network the machine is on."""
    config, _ = emulate_config(load_config(TGI), SMALL)
    servers = config.cluster.servers
    assert servers.host == "127.0.0.1"
    assert "-m simpipe.servers.emulator --host 127.0.0.1 --port 8300" in server_job_script(
        config.cluster, "c", 0)
    # The job's command itself, run here: every socket it listens on is loopback.
    command = shlex.split(server_command(servers, 0, emulated_gpus=2))
    with ServerProcess(command, READY_LINE, name="emulator") as emu:
        listening = _listening(emu.proc.pid)
    assert listening == {"127.0.0.1"}


def test_emulators_listen_where_the_workers_reach_them():
    lan = Site(None, SMALL.partitions, local_nodes=True, node_addresses=frozenset({"10.1.2.3"}))
    assert emulate_config(load_config(TGI), lan)[0].cluster.servers.host == "10.1.2.3"
    # no SLURM: a LocalCluster on this machine
    assert emulate_config(load_config(TGI), NONE)[0].cluster.servers.host == "127.0.0.1"
    # a real cluster: other nodes' workers reach the servers on the configured host
    assert emulate_config(load_config(TGI), BIG)[0].cluster.servers.host == "0.0.0.0"


@pytest.mark.slurm
def test_this_machines_slurm_gets_emulators_on_loopback(slurm_controller: None):
    """The SLURM of cluster/local-slurm.sh: its one node is this machine at 127.0.0.1."""
    site = probe_site()
    assert site.local_nodes and site.node_addresses == {"127.0.0.1"}
    assert emulate_config(load_config(TGI), site)[0].cluster.servers.host == "127.0.0.1"
