"""``[cluster]``: where the Dask workers run. Knows nothing of games or personas."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_WALLTIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)?$")


def walltime_seconds(text: str) -> int:
    """SLURM time formats: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM[:SS]``."""
    m = _WALLTIME.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a SLURM time; use HH:MM:SS or D-HH:MM:SS")
    days, a, b, c = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        return int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    if c is not None:  # HH:MM:SS
        return int(a) * 3600 + int(b) * 60 + int(c)
    if b is not None:  # MM:SS
        return int(a) * 60 + int(b)
    return int(a) * 60  # MM


def duration_seconds(text: str) -> float:
    """Dask-style durations for ``worker_lifetime``: ``3300s``, ``55m``, ``2h``."""
    m = _DURATION.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a duration; use e.g. \"55m\", \"3300s\" or \"2h\"")
    value, unit = float(m.group(1)), m.group(2) or "s"
    return value * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AdaptConfig(_Section):
    """``cluster.adapt = {minimum, maximum}``: SLURM jobs follow the task load."""

    minimum: int = Field(0, ge=0)
    maximum: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _order(self) -> "AdaptConfig":
        if self.minimum > self.maximum:
            raise ValueError(f"minimum {self.minimum} > maximum {self.maximum}")
        return self


ServerKind = Literal["none", "tgi", "vllm", "llamacpp", "custom", "emulated"]


class EmulatedServersConfig(_Section):
    """``[cluster.servers.emulated]``: GPU servers emulated by ``simpipe.inference.emulator``
    (``kind = "emulated"``, or any kind under ``simpipe run --emulate``)."""

    profile: str = "a100-llama3-8b"  # a name from simpipe.inference.emulator_profiles
    params: dict[str, float] = Field(default_factory=dict)  # per-parameter profile overrides
    time_scale: float = Field(1.0, gt=0)  # the model runs this many times faster than a GPU
    gpus_per_process: int = Field(8, ge=1)  # emulated GPUs (servers, ports) per process/job
    protocol: Literal["tgi", "openai"] = "tgi"  # tgi: TGI's routes; openai: vLLM's only
    model_id: str = ""  # the served model's name ("" = cluster.servers.model)

    @model_validator(mode="after")
    def _known_profile(self) -> EmulatedServersConfig:
        from simpipe.inference.emulator_profiles import get_profile  # noqa: PLC0415

        get_profile(self.profile, self.params)  # ValueError naming a bad name or parameter
        return self


class ServersConfig(_Section):
    """``[cluster.servers]``: inference servers started as SLURM jobs next to the workers.

    ``command`` is a template with ``{model} {host} {port} {gpus} {cpus} {python}
    {extra_args} {index}``; empty means the ready-made one for ``kind``.
    """

    kind: ServerKind = "none"
    model: str = ""  # model id (TGI, vLLM) or GGUF path (llama.cpp; "" = the embedded Gemma)
    command: str = ""
    extra_args: str = ""
    nodes: int = Field(1, ge=1)
    per_node: int = Field(1, ge=1)  # servers per node: one per GPU on GPU nodes
    gpus_per_server: int = Field(0, ge=0)
    cpus_per_server: int = Field(1, ge=1)
    memory: str = "4GB"  # per server job
    walltime: str = ""  # "" = cluster.walltime
    port: int = Field(8300, ge=1, le=65535)  # server i listens on port + i
    host: str = "0.0.0.0"  # bind address on the node
    container: Literal["none", "apptainer", "singularity"] = "none"
    image: str = ""  # container image (.sif or docker://...)
    container_args: str = ""  # e.g. "--bind /scratch"
    startup_timeout_s: float = Field(900.0, gt=0)  # model downloads and loads take minutes
    health_path: str = "/health"
    models_path: str = "/v1/models"  # "" skips this check
    job_extra_directives: list[str] = Field(default_factory=list)
    job_script_prologue: list[str] = Field(default_factory=list)
    emulated: EmulatedServersConfig = EmulatedServersConfig()

    @field_validator("walltime")
    @classmethod
    def _walltime(cls, value: str) -> str:
        if value:
            walltime_seconds(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "ServersConfig":
        if self.kind == "custom" and not self.command:
            raise ValueError('kind = "custom" needs command = "... --port {port} ..."')
        if self.kind in ("tgi", "vllm") and not self.model and not self.command:
            raise ValueError(f'kind = "{self.kind}" needs model = "<model id or path>"')
        if self.container != "none" and not self.image:
            raise ValueError(f'container = "{self.container}" needs image = "<.sif or docker://...>"')
        if self.port + self.nodes * self.per_node - 1 > 65535:
            raise ValueError(f"port {self.port} + {self.nodes * self.per_node} servers passes 65535")
        return self

    @property
    def count(self) -> int:
        return self.nodes * self.per_node

    @property
    def endpoint_backend(self) -> str | None:
        """The ``agents.<backend>`` whose endpoints these servers are."""
        if self.kind == "emulated":
            return "tgi" if self.emulated.protocol == "tgi" else "openai"
        return {"tgi": "tgi", "vllm": "openai", "llamacpp": "openai", "custom": None,
                "none": None}[self.kind]

    @property
    def servers_per_job(self) -> int:
        """Servers (ports) one SLURM job runs: an emulator process holds several GPUs."""
        return self.emulated.gpus_per_process if self.kind == "emulated" else 1


class ClusterConfig(_Section):
    kind: Literal["local", "address", "slurm"] = "local"
    # local: a distributed.LocalCluster of worker processes on this machine
    workers: int = Field(2, ge=1)
    threads_per_worker: int = Field(1, ge=1)
    memory_limit: str = "auto"  # per worker, e.g. "4GiB"; "auto": RAM / workers
    dashboard_address: str = ":8787"  # "" turns the dashboard off
    # address: an existing scheduler, e.g. "tcp://10.0.0.5:8786"
    address: str | None = None

    # slurm: dask_jobqueue.SLURMCluster; one job = `processes` workers sharing cores/memory
    queue: str | None = None
    account: str | None = None
    walltime: str = "01:00:00"
    cores: int = Field(1, ge=1)
    memory: str = "2GB"
    processes: int = Field(1, ge=1)
    jobs: int | None = Field(None, ge=0)  # fixed job count (default 1 unless adapt is set)
    adapt: AdaptConfig | None = None
    interface: str | None = None  # workers' network interface, e.g. "ib0"
    scheduler_options: dict[str, Any] = Field(default_factory=dict)  # e.g. {interface = "eth0"}
    local_directory: str | None = None  # node-local scratch for spilling, e.g. "$TMPDIR"
    log_directory: str | None = None  # job stdout/stderr
    job_extra_directives: list[str] = Field(default_factory=list)  # e.g. ["--gres=gpu:1"]
    job_script_prologue: list[str] = Field(default_factory=list)  # e.g. ["module load cuda"]
    python: str | None = None  # the Python on the nodes; default: this interpreter
    start_timeout_s: float = Field(600.0, gt=0)  # for the first workers to connect
    # "auto": retire workers before SLURM kills them at walltime (see worker_lifetime_args);
    # "none": no lifetime; or a duration such as "55m"
    worker_lifetime: str = "auto"
    worker_lifetime_stagger: str = "auto"
    servers: ServersConfig = ServersConfig()

    @field_validator("walltime")
    @classmethod
    def _walltime(cls, value: str) -> str:
        walltime_seconds(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "ClusterConfig":
        if self.kind == "address" and not self.address:
            raise ValueError('cluster.kind = "address" needs cluster.address = "tcp://host:port"')
        if self.jobs is not None and self.adapt is not None:
            raise ValueError("set cluster.jobs or cluster.adapt = {minimum, maximum}, not both")
        if self.processes > self.cores:
            raise ValueError(f"cluster.processes = {self.processes} > cluster.cores = "
                             f"{self.cores}: each worker process needs at least one core")
        for key, value in (("worker_lifetime", self.worker_lifetime),
                           ("worker_lifetime_stagger", self.worker_lifetime_stagger)):
            if value not in ("auto", "none"):
                try:
                    duration_seconds(value)
                except ValueError as exc:
                    raise ValueError(f"cluster.{key}: {exc}") from None
        if self.kind == "slurm":
            self.worker_lifetime_args()  # raises if the lifetime does not fit the walltime
        if self.servers.kind not in ("none", "emulated") and self.kind == "local":
            raise ValueError('cluster.servers needs cluster.kind = "slurm" (servers run as '
                             'SLURM jobs); set cluster.servers.kind = "none" for a local run '
                             '(emulated servers also run as local processes)')
        return self

    @property
    def n_jobs(self) -> int:
        return self.jobs if self.jobs is not None else (0 if self.adapt else 1)

    def worker_lifetime_args(self) -> list[str]:
        """``--lifetime``/``--lifetime-stagger`` for the workers, below the walltime.

        Why: SLURM kills a job at its walltime with no warning a Dask worker understands, and
        the tasks on it are lost mid-flight. A lifetime a little shorter makes Dask retire the
        worker gracefully (its data moves elsewhere) and adaptive mode starts a new job; the
        stagger keeps all workers of one scale-up from retiring in the same second.
        """
        if self.worker_lifetime == "none":
            return []
        wall = walltime_seconds(self.walltime)
        if self.worker_lifetime_stagger == "auto":
            stagger = min(300.0, wall * 0.05)
        elif self.worker_lifetime_stagger == "none":
            stagger = 0.0
        else:
            stagger = duration_seconds(self.worker_lifetime_stagger)
        if self.worker_lifetime == "auto":
            margin = max(60.0, wall * 0.05)
            lifetime = wall - margin - stagger
        else:
            lifetime = duration_seconds(self.worker_lifetime)
        if lifetime <= 0 or lifetime + stagger >= wall:
            raise ValueError(
                f"cluster.worker_lifetime ({lifetime:.0f} s) + stagger ({stagger:.0f} s) must "
                f"end before cluster.walltime = {self.walltime!r} ({wall} s); lengthen the "
                "walltime or shorten the lifetime"
            )
        args = ["--lifetime", f"{int(lifetime)}s"]
        if stagger:
            args += ["--lifetime-stagger", f"{int(stagger)}s"]
        return args
