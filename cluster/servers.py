"""Inference servers as SLURM jobs: command lines (each kind's template is its entry in
``simpipe.cluster.server_kinds``), job scripts, health checks.

One SLURM job per server, so a server can be cancelled, replaced or counted on its own; each
gets its own port (``servers.port + index``) so several can share a node without clashing.
The endpoint of a server is only known once SLURM has placed it: its node's NodeAddr plus
its port.
"""

from __future__ import annotations

import math
import re
import shlex
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from simpipe.cluster import slurm
from simpipe.cluster.config import ServersConfig, SlurmClusterConfig, memory_mib
from simpipe.core.errors import SimpipeError


class ServerError(SimpipeError, RuntimeError):
    """Servers could not be started or never became healthy; the message says why."""


@dataclass
class Server:
    index: int
    job_id: str
    port: int
    node: str = ""
    address: str = ""
    healthy: bool = False

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}"

    def as_dict(self) -> dict:
        return {**asdict(self), "url": self.url if self.address else ""}


def job_name(cluster_name: str) -> str:
    return f"simpipe-{cluster_name}-server"


def emulator_args(cfg: ServersConfig, gpus: int = 1) -> str:
    """The emulator's options for ``gpus`` emulated GPUs from ``[cluster.servers.emulated]``."""
    emu = cfg.emulated
    args = [f"--gpus {gpus}", f"--profile {shlex.quote(emu.profile)}",
            f"--time-scale {emu.time_scale!r}", f"--protocol {emu.protocol}",
            f"--model-id {shlex.quote(emu.model_id or cfg.model or 'simpipe/emulated')}"]
    args += [f"--{name.replace('_', '-')} {int(value) if float(value).is_integer() else value!r}"
             for name, value in emu.params.items()]
    return " ".join(args)


def server_command(cfg: ServersConfig, port: int | str, index: int = 0,
                   python: str | None = None, emulated_gpus: int = 1) -> str:
    """The command line of one server (or of one emulator process with ``emulated_gpus``
    GPUs), container wrapper included."""
    template = cfg.command or cfg.plugin.template
    if not template:
        raise ServerError(f'cluster.servers.kind = "{cfg.kind}" has no command template; set '
                          "cluster.servers.command")
    fields = {
        "model": shlex.quote(cfg.model) if cfg.model else "",
        "model_flag": f"--model {shlex.quote(cfg.model)}" if cfg.model else "",
        "host": cfg.host,
        "port": str(port),
        "gpus": str(max(cfg.gpus_per_server, 1)),
        "cpus": str(cfg.cpus_per_server),
        "python": shlex.quote(python or sys.executable),
        "extra_args": cfg.extra_args,
        "index": str(index),
        "emulator_args": emulator_args(cfg, emulated_gpus),
    }
    try:
        command = template.format(**fields)
    except (KeyError, IndexError) as exc:
        raise ServerError(f"cluster.servers.command: unknown placeholder {exc}; allowed: "
                          f"{', '.join('{' + k + '}' for k in fields)}") from None
    command = re.sub(r"\s+", " ", command).strip()
    if cfg.container != "none":
        gpu_flag = "--nv " if cfg.gpus_per_server else ""
        command = (f"{cfg.container} exec {gpu_flag}{cfg.container_args} "
                   f"{shlex.quote(cfg.image)} {command}")
        command = re.sub(r"\s+", " ", command)
    return command


def server_job_script(cluster: SlurmClusterConfig, cluster_name: str, index: int,
                      log_dir: str | None = None) -> str:
    """The sbatch script of server job ``index`` (one server, or ``servers_per_job``
    emulated ones on consecutive ports)."""
    cfg = cluster.servers
    first = index * cfg.servers_per_job
    in_job = min(cfg.servers_per_job, cfg.count - first)
    port = cfg.port + first
    emulated = cfg.plugin.emulator
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={job_name(cluster_name)}",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
        f"#SBATCH --cpus-per-task={cfg.cpus_per_server}",
        f"#SBATCH --mem={memory_mib(cfg.memory, 'cluster.servers.memory')}M",
        f"#SBATCH --time={cfg.walltime or cluster.walltime}",
    ]
    # Emulated GPUs need none: gpus_per_server is then what each emulated server stands for.
    gres = 0 if emulated else cfg.gpus_per_server
    lines += slurm.placement_directives(cluster.queue, cluster.account, gres)
    if log_dir:
        lines.append(f"#SBATCH --output={log_dir}/%x-%j.out")
    lines += [f"#SBATCH {d}" for d in cfg.job_extra_directives]
    lines += list(cfg.job_script_prologue)
    if cfg.batch_invariant:  # after the prologue, so that no `module load` undoes it
        lines += [f"export {k}={shlex.quote(v)}"
                  for k, v in sorted(cfg.plugin.batch_invariant_env.items())]
    ports = f"ports {port}-{port + in_job - 1}" if in_job > 1 else f"port {port}"
    lines.append(f"echo \"simpipe server job {index} on $(hostname) {ports}\"")
    # exec: scancel's SIGTERM reaches the server itself, which shuts down cleanly.
    lines.append("exec " + server_command(cfg, port, first, cluster.python, in_job))
    return "\n".join(lines) + "\n"


def launch(cluster: SlurmClusterConfig, cluster_name: str,
           log_dir: str | None = None) -> list[Server]:
    """Submit every server job; returns at once (see ``wait_healthy``)."""
    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
    cfg = cluster.servers
    servers: list[Server] = []
    try:
        for j in range(math.ceil(cfg.count / cfg.servers_per_job)):
            job = slurm.submit(server_job_script(cluster, cluster_name, j, log_dir))
            first = j * cfg.servers_per_job
            for i in range(first, min(first + cfg.servers_per_job, cfg.count)):
                servers.append(Server(i, job, cfg.port + i))
    except slurm.SlurmError:
        slurm.cancel([s.job_id for s in servers])
        raise
    return servers


@contextmanager
def running_servers(cluster: SlurmClusterConfig, cluster_name: str,
                    log_dir: str | None = None) -> Iterator[list[Server]]:
    """Every server job submitted and healthy (see ``launch``, ``wait_healthy``); all of
    them cancelled on exit, whatever happened."""
    launched: list[Server] = []
    try:
        launched = launch(cluster, cluster_name, log_dir)
        yield wait_healthy(launched, cluster.servers, log_dir=log_dir)
    finally:
        slurm.cancel([s.job_id for s in launched])


def probe(url: str, cfg: ServersConfig, timeout: float = 3.0) -> str | None:
    """None when ``health_path`` (and ``models_path``) answer 200, else what failed."""
    for path in (cfg.health_path, cfg.models_path):
        if not path:
            continue
        try:
            with urllib.request.urlopen(url + path, timeout=timeout) as resp:
                if resp.status != 200:
                    return f"{path}: HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            return f"{path}: HTTP {exc.code}"  # 503 while the model loads
        except (urllib.error.URLError, OSError) as exc:
            return f"{path}: {getattr(exc, 'reason', exc)}"
    return None


def wait_healthy(servers: list[Server], cfg: ServersConfig, *,
                 log_dir: str | None = None,
                 on_ready: Callable[[Server, float], None] | None = None) -> list[Server]:
    """Wait until every server answers its health checks; raise ServerError at
    ``startup_timeout_s`` or as soon as a server job ends."""
    started = time.monotonic()
    deadline = started + cfg.startup_timeout_s
    last: dict[int, str] = {}
    while True:
        pending = [s for s in servers if not s.healthy]
        if not pending:
            return servers
        info = slurm.jobs([s.job_id for s in pending])
        for server in pending:
            job = info.get(server.job_id)
            if job is None or job.state in slurm.ENDED_JOB_STATES:
                state = job.state if job else "ended"
                raise ServerError(f"server {server.index} (SLURM job {server.job_id}) {state} "
                                  f"before it was healthy{_log_hint(log_dir, server)}")
            if job.state != slurm.SlurmJobState.RUNNING:
                last[server.index] = f"job {job.state}"
                continue
            if not server.address:
                server.node = job.nodes
                server.address = slurm.node_address(job.nodes)
            problem = probe(server.url, cfg)
            if problem is None:
                server.healthy = True
                if on_ready:
                    on_ready(server, time.monotonic() - started)
            else:
                last[server.index] = problem
        if time.monotonic() > deadline:
            waiting = "; ".join(f"server {i}: {why}" for i, why in sorted(last.items())
                                if not servers[i].healthy)
            raise ServerError(
                f"servers not healthy within cluster.servers.startup_timeout_s = "
                f"{cfg.startup_timeout_s:g} s ({waiting}){_log_hint(log_dir, None)}; raise the "
                "timeout for large models, or check the model and the command template"
            )
        time.sleep(0.5)


def wait_urls_healthy(urls: list[str], cfg: ServersConfig) -> None:
    """Wait until every URL passes ``probe`` (servers started outside SLURM's view, e.g.
    inside a batch job); ServerError at ``startup_timeout_s``."""
    deadline = time.monotonic() + cfg.startup_timeout_s
    pending = dict.fromkeys(urls, "not tried")
    while pending:
        for url in list(pending):
            problem = probe(url, cfg)
            if problem is None:
                del pending[url]
            else:
                pending[url] = problem
        if not pending:
            return
        if time.monotonic() > deadline:
            raise ServerError(
                "servers not healthy within cluster.servers.startup_timeout_s = "
                f"{cfg.startup_timeout_s:g} s: "
                + "; ".join(f"{u}: {why}" for u, why in pending.items()))
        time.sleep(0.5)


def _log_hint(log_dir: str | None, server: Server | None) -> str:
    if not log_dir:
        return "; see the job's slurm-<jobid>.out"
    if server is None:
        return f"; see the server logs in {log_dir}"
    return f"; see {log_dir}/simpipe-*-server-{server.job_id}.out"


def requests_served(url: str, timeout: float = 2.0) -> int | None:
    """Requests a server has answered, from its Prometheus ``/metrics`` (TGI, vLLM);
    None where the server exports no such counter (llama.cpp without --metrics)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError):
        return None
    total = None
    for line in text.splitlines():
        if line.startswith(("tgi_request_success", "vllm:request_success_total")):
            try:
                total = (total or 0) + int(float(line.rsplit(" ", 1)[1]))
            except ValueError:
                continue
    return total
