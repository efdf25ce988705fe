"""Whether a run's connections to the servers it starts fit those servers' slots.

A llama.cpp server decodes ``--parallel`` requests at once, one prompt kept per slot, and
gives a request the idle slot whose prompt shares the most with it. Each Dask worker process
keeps up to ``max_concurrency`` requests in flight to each server: when all processes
together send more than the server has slots, a request waits for whichever slot frees
first, most often one that held another persona's prompt, and the server evaluates the
shared part again (measured: 43 prompt tokens a request instead of 16, 5.7 requests a
second instead of 10.9; docs/shared-answers.md). The config's default (64 per process)
is sized for vLLM and TGI, which batch whatever arrives, so a run that starts llama.cpp
servers says so before it starts, with the value that fits.
"""

from __future__ import annotations

from simpipe.config.model import Config


def connections_that_fit(slots: int, processes: int) -> int:
    """``max_concurrency`` for ``processes`` worker processes sharing servers of ``slots``
    slots each: all their connections together fill the slots and no more (at least 1)."""
    return max(1, slots // max(1, processes))


def oversubscribed_slots(config: Config) -> str | None:
    """A warning when the servers ``[cluster.servers]`` starts for this run would get more
    connections than they have slots, with the fix; None when they fit or are not known."""
    servers = config.cluster.servers
    backend = config.agents.backend
    if not servers.plugin.starts_servers or servers.endpoint_backend != backend:
        return None
    slots = servers.slots_per_server
    processes = config.cluster.most_worker_processes
    if slots is None or processes is None:
        return None
    per_process = getattr(config.agents, backend).max_concurrency
    connections = per_process * processes
    if connections <= slots:
        return None
    key = f"agents.{backend}.max_concurrency"
    fix = (f"set {key} = {connections_that_fit(slots, processes)}" if processes <= slots else
           f"set {key} = 1 and `--parallel {processes}` in cluster.servers.extra_args (a slot "
           "per worker process)")
    return (f"{key} = {per_process} with up to {processes} worker "
            f"process{'es' if processes > 1 else ''} is {connections} connections to each "
            f'cluster.servers.kind = "{servers.kind}" server, which decodes {slots} requests '
            "at a time: the rest wait for whichever slot frees first, which most often held "
            f"another prompt (measured about half as fast, docs/shared-answers.md); {fix}")
