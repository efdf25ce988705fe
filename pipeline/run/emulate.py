"""``--emulate``: a dry run of a GPU config with its inference servers replaced by emulated ones.

The same count of servers and the same protocol (TGI servers -> TGI routes; vLLM and
llama.cpp servers -> OpenAI routes only), timed by ``[cluster.servers.emulated]`` (a named
profile; TGI's ``--max-concurrent-requests`` / ``--max-batch-prefill-tokens`` and vLLM's
``--max-num-seqs`` / ``--max-num-batched-tokens`` from ``extra_args`` carry over). What cannot
work on this machine is made to work, and said in one line each:

- GPU-only settings of the server jobs go (container, ``--gres``, their prologue): an
  emulator is a small Python process; it runs with the workers' environment.
- The workers keep the configured SLURM settings when that SLURM answers and fits them (its
  partitions, node size, and, when its nodes are this machine, the network interfaces);
  otherwise they run on the SLURM that answers with settings that fit it, and without any
  SLURM in a ``LocalCluster``, the emulators then as local processes.
- The emulators listen where the workers reach them: on loopback when every SLURM node is
  this machine at a loopback address (or no SLURM answers), on that one address when every
  node is this machine at it; only on a real multi-node cluster on the configured
  ``cluster.servers.host``.
- Results go to ``<run.name>-emulated``: emulated answers never mix with a real run's.
"""

from __future__ import annotations

import ipaddress
import math
import os
import shlex
from dataclasses import dataclass, field
from typing import Any

from simpipe.cluster import slurm
from simpipe.cluster.config import ServersConfig, memory_mib
from simpipe.cluster.server_kinds import SERVER_KINDS
from simpipe.config.backends import BACKENDS, endpoint_backends
from simpipe.config.model import Config, config_from_dict
from simpipe.core.errors import SimpipeError
from simpipe.inference.http.endpoints import is_local

LOOPBACK = "127.0.0.1"
SUFFIX = "-emulated"
#: The server kind that replaces the configured one.
EMULATOR_KIND = next(kind.name for kind in SERVER_KINDS.values() if kind.emulator)


class EmulateError(SimpipeError, ValueError):
    """The config cannot be emulated; the message says why and what to change."""


@dataclass
class Site:
    """The SLURM this machine reaches: None problem means it answered."""

    problem: str | None
    partitions: list[slurm.Partition] = field(default_factory=list)
    local_nodes: bool = False  # every node is this machine
    interfaces: frozenset[str] = frozenset()  # this machine's network interfaces
    node_addresses: frozenset[str] = frozenset()  # the nodes' NodeAddr: what workers dial

    @property
    def cpus(self) -> int:
        return max((p.cpus for p in self.partitions), default=os.cpu_count() or 1)

    @property
    def memory_mb(self) -> int:
        return max((p.memory_mb for p in self.partitions), default=2048)


def probe_site() -> Site:
    """Ask SLURM (and this machine) what a dry run can use."""
    import psutil  # a declared dependency, only needed here

    interfaces = frozenset(psutil.net_if_addrs())
    problem = slurm.controller_problem()
    if problem:
        return Site(problem, interfaces=interfaces)
    try:
        parts = slurm.partitions()
        nodes = {n for p in parts for n in slurm.expand_nodelist(p.nodes)}
        addresses = frozenset(slurm.node_address(n) for n in nodes)
        local = bool(nodes) and all(is_local(f"http://{a}") for a in addresses)
    except slurm.SlurmError as exc:
        return Site(str(exc), interfaces=interfaces)
    return Site(None, parts, local, interfaces, addresses)


def _is_loopback(address: str) -> bool:
    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def bind_host(site: Site) -> str | None:
    """Where emulators on ``site`` listen so that exactly the workers reach them: loopback
    when every node is this machine at a loopback address, that address when every node is
    this machine at one other address; None (the configured host) on other clusters."""
    if not site.local_nodes or not site.node_addresses:
        return None
    if all(_is_loopback(a) for a in site.node_addresses):
        return LOOPBACK
    if len(site.node_addresses) == 1:
        return next(iter(site.node_addresses))
    return None


def _misfits(cluster: Any, site: Site) -> list[str]:
    """Why the configured workers cannot run on ``site`` (empty: they can)."""
    why = []
    names = {p.name for p in site.partitions}
    if cluster.queue and cluster.queue not in names:
        why.append(f"no partition {cluster.queue!r} (there: {', '.join(sorted(names))})")
    if site.local_nodes:
        for key, name in (("cluster.interface", cluster.interface),
                          ("scheduler_options.interface",
                           cluster.scheduler_options.get("interface"))):
            if name and name not in site.interfaces:
                why.append(f"no interface {name!r} here ({key})")
    if cluster.cores > site.cpus:
        why.append(f"cluster.cores = {cluster.cores} > {site.cpus} CPUs per node")
    if memory_mib(cluster.memory, "cluster.memory") > site.memory_mb:
        why.append(f"cluster.memory = {cluster.memory} > {site.memory_mb} MB per node")
    return why


def _server_params(servers: ServersConfig) -> dict[str, float]:
    """Emulator parameters from the real servers' defaults and flags (their kind's
    ``emulator_params`` and ``emulator_flags``), then the user's own params."""
    params: dict[str, float] = dict(servers.plugin.emulator_params)
    flags = servers.plugin.emulator_flags
    words = shlex.split(servers.extra_args)
    for i, word in enumerate(words):
        name, _, value = word.partition("=")
        if name in flags:
            value = value or (words[i + 1] if i + 1 < len(words) else "")
            try:
                params[flags[name]] = float(value)
            except ValueError:
                continue
    params.update(servers.emulated.params)
    return params


def emulate_config(config: Config, site: Site, place: bool = True) -> tuple[Config, list[str]]:
    """The dry-run config and one line per change worth telling. ``place``: also decide
    where workers and emulators run (not for a persistent cluster that already runs)."""
    raw = config.model_dump(mode="json")
    cluster, servers = raw["cluster"], raw["cluster"]["servers"]
    kind = config.cluster.servers.plugin
    backend = config.agents.plugin
    served = " or ".join(endpoint_backends())
    notes: list[str] = []
    if not kind.starts_servers:
        if not backend.takes_endpoints:
            raise EmulateError(f"--emulate replaces inference servers, but agents.backend = "
                               f"{backend.name!r} uses none; use {served}")
        endpoints = config.agents.settings.endpoints
        servers.update(nodes=1, per_node=len(endpoints))
    elif kind.endpoint_backend is None and not kind.emulator and not backend.takes_endpoints:
        raise EmulateError(f"--emulate: {kind.name} servers feed agents.backend = "
                           f"{backend.name!r}; set agents.backend to {served}")
    emulated = servers["emulated"]
    if not kind.emulator:
        # The emulator answers the requests of the back-end the real servers feed, or of
        # the config's own back-end where the kind does not say (no servers, a custom one).
        protocol = kind.endpoint_backend or backend.name
        emulated.update(protocol=protocol, params=_server_params(config.cluster.servers),
                        model_id=emulated["model_id"] or config.cluster.servers.model)
        if protocol == backend.name and not emulated["model_id"]:
            emulated["model_id"] = backend.request_model(config.agents.settings)
        servers.update(kind=EMULATOR_KIND, command="", extra_args="", container="none", image="",
                       container_args="", cpus_per_server=1, memory="1GB",
                       job_extra_directives=[], health_path="/health",
                       models_path="/v1/models",
                       # the workers' environment: a SLURM cluster's prologue, else none
                       job_script_prologue=list(getattr(config.cluster,
                                                        "job_script_prologue", [])),
                       startup_timeout_s=min(config.cluster.servers.startup_timeout_s, 300.0))
    count = servers["nodes"] * servers["per_node"]
    if "gpus_per_process" not in config.cluster.servers.emulated.model_fields_set:
        emulated["gpus_per_process"] = servers["per_node"]  # one emulator job per node
    if place:
        _place(config, cluster, servers, site, notes)
    raw["run"]["name"] = config.run.name + SUFFIX
    emu = config_from_dict(raw, "--emulate")
    e = emu.cluster.servers.emulated
    if emu.cluster.servers.gpus_per_server > 1:
        notes.append(f"--emulate: each emulated server runs the one-GPU profile {e.profile}; "
                     f"tensor parallelism over gpus_per_server = "
                     f"{emu.cluster.servers.gpus_per_server} is not modelled (GPU-hours count "
                     "every GPU)")
    routes = BACKENDS[e.protocol].routes
    processes = math.ceil(count / e.gpus_per_process)
    notes.insert(0, f"--emulate: {count} emulated {e.profile} GPU server(s) with {routes} "
                    f"routes replace cluster.servers ({kind.name}), {processes} emulator "
                    f"process(es), time scale {e.time_scale:g}; results go to "
                    f"{emu.run_dir}")
    return emu, notes


def _place(config: Config, cluster: dict, servers: dict, site: Site, notes: list[str]) -> None:
    """Workers and emulators where they can run: the configured SLURM, the SLURM that
    answers, or this machine."""
    cfg = config.cluster
    count = servers["nodes"] * servers["per_node"]
    if cfg.kind != "slurm":
        servers["host"] = LOOPBACK
        _local_emulators(servers, count, site, notes)
        return
    if site.problem is not None:
        workers = max(1, min(cfg.n_jobs * cfg.processes or 1, os.cpu_count() or 1))
        # A local cluster has none of the SLURM keys: the section is made anew.
        local = {"kind": "local", "workers": workers, "memory_limit": "auto",
                 "threads_per_worker": max(1, cfg.cores // cfg.processes),
                 "dashboard_address": cfg.dashboard_address, "servers": servers}
        servers["host"] = LOOPBACK
        cluster.clear()
        cluster.update(local)
        notes.append(f"--emulate: no SLURM answers ({site.problem}): workers run in a "
                     f"LocalCluster ({workers} worker process(es))")
        _local_emulators(servers, count, site, notes)
        return
    host = bind_host(site)
    if host is not None:
        servers["host"] = host
    misfits = _misfits(cfg, site)
    if not misfits:
        return
    jobs = max(1, min(cfg.n_jobs * cfg.processes or 1, site.cpus))
    cores = max(1, min(cfg.cores // cfg.processes, site.cpus))
    # a quarter of a node for all workers: the node is shared (servers, other users' jobs)
    memory_mb = int(min(memory_mib(cfg.memory, "cluster.memory") / cfg.processes,
                        site.memory_mb / 4 / jobs))
    options = {k: v for k, v in cfg.scheduler_options.items() if k != "interface"}
    cluster.update(queue=None, account=None, jobs=jobs, adapt=None, processes=1, cores=cores,
                   memory=f"{memory_mb}MiB", interface="lo" if site.local_nodes else None,
                   scheduler_options=options, job_extra_directives=[],
                   job_script_prologue=[], local_directory=None, python=None)
    servers["job_script_prologue"] = []
    processes = max(1, min(math.ceil(count / servers["emulated"]["gpus_per_process"]),
                           site.cpus // 2))
    servers["emulated"]["gpus_per_process"] = math.ceil(count / processes)
    notes.append(f"--emulate: the configured workers do not fit the SLURM here "
                 f"({'; '.join(misfits)}): they run there as {jobs} job(s) x 1 worker "
                 f"({cores} core(s), {memory_mb} MB), the emulators as {processes} job(s)")


def _local_emulators(servers: dict, count: int, site: Site, notes: list[str]) -> None:
    processes = max(1, min(count, (os.cpu_count() or 2) // 2))
    servers["emulated"]["gpus_per_process"] = math.ceil(count / processes)
    notes.append(f"--emulate: the emulated servers run on this machine as {processes} "
                 "process(es)")
