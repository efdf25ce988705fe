"""``simpipe sbatch``: one SLURM batch script that runs servers, scheduler, workers and the
pipeline inside a single allocation, so a user can submit it and walk away.

Layout inside the job: one ``srun`` step starts the inference servers (``per node`` tasks on
every node, ports ``servers.port + SLURM_LOCALID``, each with its own GPUs); a second step
runs ``dask_jobqueue.slurm.SLURMRunner`` over ``ntasks`` tasks: rank 0 is the scheduler,
rank 1 the client that runs the pipeline, the rest are workers. Both steps use
``--overlap`` because they share the same CPUs, memory and GPUs of the allocation.
"""

from __future__ import annotations

import math
import os
import shlex
import sys
from dataclasses import dataclass

from simpipe.cluster import slurm
from simpipe.cluster.config import SlurmClusterConfig, memory_mib
from simpipe.cluster.servers import server_command
from simpipe.cluster.slurm import placement_directives


@dataclass(frozen=True)
class BatchOptions:
    config_path: str
    overrides: tuple[str, ...] = ()
    nodes: int = 1
    gpus_per_node: int = 0
    workers_per_node: int = 1
    job_name: str = ""  # default "simpipe" (write_batch_script: "simpipe-<run name>")
    output: str | None = None  # the job's stdout file; default slurm-%j.out
    time: str | None = None  # default cluster.walltime
    memory: str | None = None  # per node; default cluster.memory x tasks per node
    workdir: str | None = None  # default the current directory
    overcommit: bool = False  # more tasks than CPUs (small test machines)


def servers_per_node(cluster: SlurmClusterConfig, gpus_per_node: int) -> int:
    cfg = cluster.servers
    if not cfg.plugin.starts_servers:
        return 0
    if cfg.gpus_per_server and gpus_per_node:
        return max(1, gpus_per_node // cfg.gpus_per_server)
    return cfg.per_node


def batch_script(cluster: SlurmClusterConfig, opts: BatchOptions) -> str:
    """The text of the batch script."""
    if opts.nodes < 1 or opts.workers_per_node < 1:
        raise ValueError("--nodes and --workers-per-node must be >= 1")
    python = cluster.python or sys.executable
    workdir = opts.workdir or os.getcwd()
    n_tasks = opts.nodes * opts.workers_per_node + 2  # + scheduler + client
    tasks_per_node = math.ceil(n_tasks / opts.nodes)
    threads = max(1, cluster.cores // cluster.processes)
    per_node_servers = servers_per_node(cluster, opts.gpus_per_node)
    srv = cluster.servers
    server_mb = memory_mib(srv.memory, "cluster.servers.memory") * per_node_servers
    mem_mb = (memory_mib(opts.memory, "--mem") if opts.memory
              else memory_mib(cluster.memory, "cluster.memory") * tasks_per_node + server_mb)
    cpus_per_node = threads * tasks_per_node + srv.cpus_per_server * per_node_servers
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={opts.job_name or 'simpipe'}",
        f"#SBATCH --nodes={opts.nodes}",
        f"#SBATCH --ntasks={n_tasks}",
        f"#SBATCH --cpus-per-task={threads}",
        f"#SBATCH --mem={mem_mb}M",
        f"#SBATCH --time={opts.time or cluster.walltime}",
        f"#SBATCH --chdir={workdir}",
    ]
    if opts.overcommit:
        lines.append("#SBATCH --overcommit")
    if opts.output:
        lines.append(f"#SBATCH --output={opts.output}")
    lines += placement_directives(cluster.queue, cluster.account, opts.gpus_per_node)
    lines += [f"#SBATCH {d}" for d in cluster.job_extra_directives]
    lines += [
        f"# about {cpus_per_node} CPUs per node in use: {tasks_per_node} Dask tasks x "
        f"{threads} threads + {per_node_servers} server(s) x {srv.cpus_per_server}",
        "set -euo pipefail",
        *cluster.job_script_prologue,
        *srv.job_script_prologue,
    ]
    if per_node_servers:
        task = ["port=$((SIMPIPE_SERVER_PORT + SLURM_LOCALID))"]
        if srv.gpus_per_server:
            g = srv.gpus_per_server
            task.append(f"first=$((SLURM_LOCALID * {g})); "
                        f"export CUDA_VISIBLE_DEVICES=$(seq -s, $first $((first + {g} - 1)))")
        task.append("exec " + server_command(srv, "$port", 0, python))  # type: ignore[arg-type]
        lines += [
            "",
            "# Inference servers: one task per server, ports SIMPIPE_SERVER_PORT + local id.",
            f"export SIMPIPE_SERVER_PORT={srv.port} SIMPIPE_SERVERS_PER_NODE={per_node_servers}",
            f"srun --overlap --nodes={opts.nodes} --ntasks-per-node={per_node_servers} "
            f"--ntasks={opts.nodes * per_node_servers} --cpus-per-task={srv.cpus_per_server} "
            f"bash -c {shlex.quote('; '.join(task))} &",
            "servers=$!",
            "trap 'kill $servers 2>/dev/null; wait $servers 2>/dev/null || true' EXIT",
        ]
    run = [python, "-m", "simpipe.cli", "batch-task", opts.config_path]
    for item in opts.overrides:
        run += ["--set", item]
    lines += [
        "",
        "# Dask through SLURMRunner: rank 0 scheduler, rank 1 the pipeline, the rest workers.",
        f"srun --overlap --kill-on-bad-exit=1 --ntasks={n_tasks} --cpus-per-task={threads} "
        + " ".join(shlex.quote(a) for a in run),
    ]
    return "\n".join(lines) + "\n"


def batch_endpoints(cluster: SlurmClusterConfig) -> list[str]:
    """Inside the job: the URLs of the servers the batch script started."""
    per_node = int(os.environ.get("SIMPIPE_SERVERS_PER_NODE", "0"))
    port = int(os.environ.get("SIMPIPE_SERVER_PORT", str(cluster.servers.port)))
    if not per_node:
        return []
    urls = []
    for node in slurm.expand_nodelist(os.environ["SLURM_JOB_NODELIST"]):
        addr = slurm.node_address(node)
        host = f"[{addr}]" if ":" in addr else addr
        urls += [f"http://{host}:{port + i}" for i in range(per_node)]
    return urls
