"""Where a run executes: the Dask client and the inference endpoints a run needs, up while an
executor is entered and torn down when it is left, whatever happened::

    with executor_for(config) as ex:             # workers and [cluster.servers] start here
        run_simulation(config, executor=ex)      # any number of runs share them
        run_simulation(other_config, executor=ex)
    # the workers, their SLURM jobs and the servers are gone

As in dask-jobqueue (``JobQueueCluster`` and its ``SLURMCluster``) and datatrove (its
executors), the shared logic is one base class, ``Executor``: starting ``[cluster.servers]``
(SLURM jobs, or emulator processes on this machine), waiting for them while the workers
start, filling ``agents.<backend>.endpoints``, and tearing everything down in reverse order.
What differs per ``cluster.kind`` is not a subclass: ``Executor`` itself runs any kind,
connecting through the kind's plug-in (``simpipe.cluster.kinds.CLUSTER_KINDS``: its
settings model and its ``Workers``, what starts and stops its workers, typed by its
settings). A subclass overrides a few methods where a run executes somewhere else:
``connect`` (the Dask client), ``start_servers`` (servers someone else started),
``prepare`` (the config as it runs there) and ``progress`` (told as things come up):

- ``ClusterExecutor``: ``--cluster NAME``, a persistent cluster of ``simpipe cluster up``
  (its scheduler and its healthy servers; nothing is started);
- ``BatchExecutor``: inside a ``simpipe sbatch`` job (the job's first step started the
  servers; rank 0 is the scheduler, rank 1 the run, the other ranks workers);
- ``EmulatedExecutor``: ``--emulate``, a wrapper around any of them whose config has its
  servers replaced by emulated GPUs (``simpipe.run.emulate``);
- ``OwnClientExecutor``: a caller's own client; nothing is started or stopped.

The persistent cluster's manager process is an ``Executor`` too (``simpipe.run.manager``).
Lines for the user go to ``say`` (``print`` unless given).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

from simpipe.cluster import servers as srv
from simpipe.cluster import slurm
from simpipe.cluster.config import AddressClusterConfig, ServersConfig, SlurmClusterConfig
from simpipe.cluster.kinds import CLUSTER_KINDS
from simpipe.cluster.plugin import Workers
from simpipe.cluster.servers import ServerError
from simpipe.cluster.state import StateError, read_section, read_state, run_target
from simpipe.config.backends import BACKENDS
from simpipe.config.model import ClusterConfig, Config, ConfigError
from simpipe.core.errors import SimpipeError
from simpipe.run.emulate import SUFFIX, Site, emulate_config, probe_site
from simpipe.run.server_grammar import slower_grammar
from simpipe.run.server_slots import oversubscribed_slots

if TYPE_CHECKING:  # distributed is imported when a client is made: `simpipe validate` is light
    from distributed import Client

#: Where an executor's lines for the user go.
Say = Callable[[str], None]
#: What ``start_servers`` returns: waits until the servers answer, then gives their URLs.
WaitForServers = Callable[[], list[str]]


class ExecutorError(SimpipeError, RuntimeError):
    """An executor used the wrong way (entered twice, a run outside it)."""


def _print(text: str) -> None:
    print(text, flush=True)


def served_backend(config: Config) -> str:
    """The ``agents.<backend>`` whose endpoints ``[cluster.servers]`` are."""
    return config.cluster.servers.endpoint_backend or config.agents.backend


def url_summary(urls: list[str], show: int = 4) -> str:
    """Up to ``show`` URLs and how many more: 32 servers do not fit on a line."""
    more = f" and {len(urls) - show} more" if len(urls) > show else ""
    return ", ".join(urls[:show]) + more


class Executor:
    """Where a run executes. Entered: ``client`` is connected, ``[cluster.servers]`` (if
    any) answer at ``endpoints``, and ``config`` is the config as it runs here, with them as
    ``agents.<backend>.endpoints``; left: whatever it started is stopped, in reverse order.
    ``run_config(other)`` points another run's config at the same cluster and servers.

    ``name`` names the SLURM jobs it submits (default ``run-<run.name>-<pid>``). The
    workers are those of ``cluster.kind``'s plug-in (``workers`` while entered)."""

    #: Whether the servers' URLs go into ``config``; not for a cluster that runs no run itself.
    fills_endpoints: ClassVar[bool] = True
    #: The batch job name of the workers (a kind whose workers are jobs).
    worker_job_name: str = "simpipe-worker"

    def __init__(self, config: Config, *, say: Say | None = None,
                 name: str | None = None) -> None:
        self.say: Say = say or _print
        self.name = name or f"run-{config.run.name}-{os.getpid()}"
        self.client: Client | None = None
        self.endpoints: list[str] = []
        self.servers: list[srv.Server] = []  # server jobs this executor submitted
        self.workers: Workers[Any] | None = None  # the kind's executor, once connected
        self._stack: ExitStack | None = None
        self.config = self.prepare(config)

    # --- what a subclass overrides ------------------------------------------------------

    def prepare(self, config: Config) -> Config:
        """The config as it will run here, before its servers' endpoints are known; checked
        before anything starts."""
        servers = config.cluster.servers
        backend = served_backend(config)
        if servers.plugin.starts_servers and config.agents.backend != backend:
            raise ConfigError(f'cluster.servers.kind = "{servers.kind}" serves agents.backend = '
                              f'"{backend}", but the config has agents.backend = '
                              f'"{config.agents.backend}"')
        for warning in (oversubscribed_slots(config), slower_grammar(config)):
            if warning is not None:
                self.say(f"warning: {warning}")
        return config

    def connect(self, stack: ExitStack) -> Client:
        """A connected client; what it started goes on ``stack`` (closed on exit). Here:
        the workers of ``cluster.kind``'s plug-in, given its settings typed."""
        cluster = self.config.cluster
        self.workers = CLUSTER_KINDS[cluster.kind].workers_for(
            cluster, job_name=self.worker_job_name, progress=self.progress)
        return self.workers.connect(stack)

    def start_servers(self, stack: ExitStack) -> WaitForServers:
        """``[cluster.servers]``, started for as long as this executor is entered (their
        stop goes on ``stack``): SLURM jobs where the kind starts jobs, emulator processes
        on this machine otherwise. Returns at once; the workers start while they load."""
        servers = self.config.cluster.servers
        if not servers.plugin.starts_servers:
            return list
        cluster = self.config.cluster
        if cluster.server_jobs:  # server jobs are SLURM jobs: they need its keys
            return self._server_jobs(stack, slurm.require_slurm(cluster, "server jobs"))
        return self._local_emulators(stack, servers)

    def progress(self, **state: Any) -> None:
        """Told as servers (``servers=``), the scheduler (``scheduler=``, ``dashboard=``) and
        the worker jobs (``worker_jobs=``) come up; nothing here (a persistent cluster's
        manager writes them to its state file)."""

    # --- the shared logic ---------------------------------------------------------------

    @property
    def backend(self) -> str:
        """The ``agents.<backend>`` whose endpoints this executor's servers are."""
        return served_backend(self.config)

    @property
    def entered(self) -> bool:
        return self._stack is not None

    def worker_jobs(self) -> list[str]:
        """The batch job ids of the workers now (adaptive mode and lifetimes replace jobs);
        none for a kind without jobs, or before ``connect``."""
        return self.workers.worker_jobs() if self.workers is not None else []

    def __enter__(self) -> Executor:
        if self._stack is not None:
            raise ExecutorError(f"{type(self).__name__} is already entered: enter it once and "
                                "run inside it")
        with ExitStack() as stack:  # anything that fails on the way stops what started
            wait = self.start_servers(stack)
            client = self.connect(stack)
            urls = wait()
            self._stack = stack.pop_all()
        self.client = client
        self.endpoints = list(urls)
        if urls and self.fills_endpoints:
            self.config = self.config.with_endpoints(self.backend, self.endpoints)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        stack, self._stack, self.client, self.workers = self._stack, None, None, None
        if stack is not None:
            stack.close()

    def run_config(self, config: Config) -> Config:
        """``config`` as it runs here: this executor's ``[cluster]`` (what the run records,
        and what an emulated run's estimate reads) and, when it runs the back-end these
        servers serve, their URLs as ``agents.<backend>.endpoints``."""
        if not self.entered:
            raise ExecutorError(f"{type(self).__name__} is not entered: "
                                "`with executor:` around the runs")
        if config.cluster != self.config.cluster:
            config = config.with_sections("executor", cluster=self.config.cluster)
        if self.endpoints and config.agents.backend == self.backend:
            config = config.with_endpoints(self.backend, self.endpoints)
        return config

    def _server_jobs(self, stack: ExitStack, cluster: SlurmClusterConfig) -> WaitForServers:
        """One SLURM job per server (or per emulator process); cancelled on exit."""
        log_dir = cluster.log_directory
        slurm.require_controller()
        stack.callback(lambda: slurm.cancel([s.job_id for s in self.servers]))
        self.servers = srv.launch(cluster, self.name, log_dir)
        self.say(f"servers: {len(self.servers)} in {len({s.job_id for s in self.servers})} "
                 "SLURM job(s) submitted, waiting for health")
        self.progress(servers=[s.as_dict() for s in self.servers])

        def wait() -> list[str]:
            srv.wait_healthy(self.servers, cluster.servers, log_dir=log_dir)
            urls = [s.url for s in self.servers]
            self.say(f"servers healthy: {url_summary(urls)}")
            self.progress(servers=[s.as_dict() for s in self.servers])
            return urls

        return wait

    def _local_emulators(self, stack: ExitStack, servers: ServersConfig) -> WaitForServers:
        try:
            urls = stack.enter_context(servers.plugin.local_processes()(servers))
        except (RuntimeError, OSError) as exc:
            raise ServerError(f"emulated servers did not start: {exc}") from None
        self.say(f"emulated servers ready: {len(urls)} on this machine")
        return lambda: urls


class ClusterExecutor(Executor):
    """``--cluster NAME``: a persistent cluster from ``simpipe cluster up``, its scheduler
    and its healthy servers (``cluster.kind = "address"``); this executor starts and stops
    nothing."""

    def __init__(self, config: Config, cluster_name: str, *, emulate: bool = False,
                 say: Say | None = None) -> None:
        self.cluster_name = cluster_name
        self.emulate = emulate
        self._urls: list[str] = []
        super().__init__(config, say=say)

    def prepare(self, config: Config) -> Config:
        """``cluster.kind = "address"`` with the cluster's scheduler. The rest of
        ``[cluster]`` described that cluster when it was started; only emulated servers stay
        (the estimate of an emulated run is made from them)."""
        name = self.cluster_name
        state = read_state(name)
        if read_section(name).servers.plugin.emulator and not self.emulate:
            raise StateError(f"cluster {name!r} serves emulated GPUs: add --emulate "
                             "(its results then go to <run.name>-emulated)")
        scheduler, self._urls = run_target(
            state, config.agents.backend, BACKENDS[config.agents.backend].takes_endpoints)
        servers = (config.cluster.servers if config.cluster.servers.plugin.emulator
                   else ServersConfig())
        return config.with_sections(f"--cluster {name}", cluster=AddressClusterConfig(
            address=scheduler, servers=servers))

    def start_servers(self, stack: ExitStack) -> WaitForServers:
        return lambda: self._urls  # the cluster's own, already healthy

    @property
    def backend(self) -> str:
        return self.config.agents.backend  # the cluster's servers match it (run_target)


class BatchExecutor(Executor):
    """Inside a ``simpipe sbatch`` job (``simpipe.cluster.batch`` writes the script): rank 0
    runs the scheduler and every rank from 2 a worker, each blocking inside
    ``SLURMRunner`` until the job ends; only rank 1, the run's, gets past ``__enter__``,
    which then waits for the workers and for the servers the job's first step started."""

    def prepare(self, config: Config) -> Config:
        slurm.require_slurm(config.cluster, "simpipe sbatch")
        return super().prepare(config)

    def connect(self, stack: ExitStack) -> Client:
        from dask_jobqueue.slurm import SLURMRunner  # heavy, only in the job

        from simpipe.cluster.connect import SimpipeClient, dashboard_scheduler_options

        cluster = slurm.require_slurm(self.config.cluster, "simpipe sbatch")
        scheduler_file = (Path(self.config.run.output_dir).resolve() / ".simpipe-batch"
                          / "scheduler-{job_id}.json")
        scheduler_file.parent.mkdir(parents=True, exist_ok=True)
        stack.callback(scheduler_file.with_name(scheduler_file.name.format(
            job_id=os.environ.get("SLURM_JOB_ID", ""))).unlink, missing_ok=True)
        scheduler_options = {**({"interface": cluster.interface} if cluster.interface else {}),
                             **dashboard_scheduler_options(cluster)}
        worker_options: dict[str, Any] = {
            "nthreads": max(1, cluster.cores // cluster.processes),
            "memory_limit": "auto"}  # the node's memory over its workers
        if cluster.interface:
            worker_options["interface"] = cluster.interface
        if cluster.local_directory:
            worker_options["local_directory"] = os.path.expandvars(cluster.local_directory)
        runner = stack.enter_context(SLURMRunner(
            scheduler_file=str(scheduler_file), scheduler_options=scheduler_options,
            worker_options=worker_options))
        client = stack.enter_context(SimpipeClient(runner))
        client.wait_for_workers(runner.n_workers, timeout=cluster.start_timeout_s)
        return client

    def start_servers(self, stack: ExitStack) -> WaitForServers:
        from simpipe.cluster.batch import batch_endpoints

        def wait() -> list[str]:  # after connect: only the run's rank waits
            urls = batch_endpoints(self.config.cluster)
            if urls:
                self.say(f"waiting for {len(urls)} server(s): {url_summary(urls)}")
                srv.wait_urls_healthy(urls, self.config.cluster.servers)
            return urls

        return wait


class EmulatedExecutor(Executor):
    """``--emulate``: a dry run on any of the others, its servers emulated GPUs and its
    results in ``<run.name>-emulated`` (``simpipe.run.emulate``; each change said in
    one line). ``cluster_name``: on that persistent cluster (which already runs: nothing
    is placed); otherwise the kind of the emulated config's ``[cluster]`` chooses."""

    def __init__(self, config: Config, *, cluster_name: str | None = None,
                 say: Say | None = None) -> None:
        say = say or _print
        config = emulated(config, place=cluster_name is None, say=say)
        self.inner = (ClusterExecutor(config, cluster_name, emulate=True, say=say) if cluster_name
                      else Executor(config, say=say))
        super().__init__(self.inner.config, say=say, name=self.inner.name)

    def prepare(self, config: Config) -> Config:
        return config  # the inner executor's, checked there

    def connect(self, stack: ExitStack) -> Client:
        return self.inner.connect(stack)

    def start_servers(self, stack: ExitStack) -> WaitForServers:
        wait = self.inner.start_servers(stack)

        def waited() -> list[str]:
            urls = wait()
            self.servers = self.inner.servers
            return urls

        return waited

    @property
    def backend(self) -> str:
        return self.inner.backend

    def run_config(self, config: Config) -> Config:
        if not config.run.name.endswith(SUFFIX):
            config = config.with_sections("--emulate", run=config.run.model_copy(
                update={"name": config.run.name + SUFFIX}))
        return super().run_config(config)


class OwnClientExecutor(Executor):
    """A caller's own client (``run_simulation(config, client=...)``): the caller owns the
    cluster, workers and servers alike; nothing is started or stopped, and the config's
    endpoints are used as they are."""

    def __init__(self, config: Config, client: Client, *, say: Say | None = None) -> None:
        self._client = client
        super().__init__(config, say=say)

    def prepare(self, config: Config) -> Config:
        return config

    def connect(self, stack: ExitStack) -> Client:
        return self._client

    def start_servers(self, stack: ExitStack) -> WaitForServers:
        return list


def executor_for(config: Config, *, emulate: bool = False, cluster_name: str | None = None,
                 say: Say | None = None) -> Executor:
    """The executor of ``simpipe run CONFIG [--emulate] [--cluster NAME]``: ``--emulate``
    wraps the one ``--cluster NAME`` or ``cluster.kind`` chooses."""
    if emulate:
        return EmulatedExecutor(config, cluster_name=cluster_name, say=say)
    if cluster_name:
        return ClusterExecutor(config, cluster_name, say=say)
    return Executor(config, say=say)


@contextmanager
def cluster_client(cluster: ClusterConfig, *, say: Say | None = None) -> Iterator[Client]:
    """A client of a ``[cluster]`` section alone, through its kind's plug-in and without
    ``[cluster.servers]``: for work that uses no game agents (``simpipe population
    build``); what it started is stopped on exit."""
    cluster = cluster.model_copy(update={"servers": ServersConfig()})
    with Executor(Config(cluster=cluster), say=say) as executor:
        yield executor.client


def emulated(config: Config, *, place: bool = True, say: Say | None = None) -> Config:
    """``--emulate``'s dry-run config (``simpipe.run.emulate.emulate_config``), its notes
    said one line each. ``place``: also decide where workers and emulators run (asks SLURM);
    not for a persistent cluster, which already runs."""
    config, notes = emulate_config(config, probe_site() if place else Site(None), place)
    for note in notes:
        (say or _print)(note)
    return config


