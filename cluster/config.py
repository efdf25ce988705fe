r"""``[cluster]``: where the Dask workers run. Knows nothing of games or personas.

The settings models of the built-in ``cluster.kind``\ s, each holding only that kind's keys
on the common base ``ClusterSettings`` (which gives every kind ``[cluster.servers]``). A
kind is one plug-in object, ``simpipe.cluster.plugin.ClusterKind``, registered in
``simpipe.cluster.kinds.CLUSTER_KINDS``: its settings model from here and its executor.
"""

from __future__ import annotations

import datetime
import math
import re
import shlex
from typing import Annotated, Any, ClassVar, Literal

from dask.utils import parse_bytes
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    FiniteFloat,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

from simpipe.cluster.server_kinds import (
    DEFAULT_SERVER_KIND,
    SERVER_KINDS,
    ServerKindPlugin,
    kind_description,
)
from simpipe.servers.emulator_profiles import (
    MAX_GPUS_PER_PROCESS,
    TIME_SCALE_RANGE,
    get_profile,
)

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


def memory_bytes(text: str) -> int:
    """A positive amount of memory as Dask reads it (``dask.utils.parse_bytes``: ``"4GiB"`` is
    4 x 2**30 bytes, ``"2GB"`` 2 x 10**9, ``"5e9"`` and ``"512 MB"`` too); ValueError
    otherwise."""
    try:
        amount = parse_bytes(text) if text.strip() else 0
    except (ValueError, OverflowError):
        amount = 0
    if amount <= 0:
        raise ValueError("expected an amount of memory such as \"4GiB\", \"2GB\" or \"512MB\"")
    return amount


def memory_amount(text: str) -> str:
    """An amount of memory (see ``memory_bytes``), unchanged; ValueError otherwise."""
    memory_bytes(text)
    return text


def walltime_text(text: str) -> str:
    """A SLURM time limit (see ``walltime_seconds``), unchanged; ValueError otherwise."""
    walltime_seconds(text)
    return text


def toml_time_as_text(value: Any) -> Any:
    """An unquoted ``00:30:00`` is a TOML time, not a string: taken as the text written."""
    return value.isoformat() if isinstance(value, datetime.time) else value


def slurm_name(text: str) -> str:
    """A partition or account name as it goes into an ``#SBATCH`` line: not empty, no
    white space (``""`` wrote ``#SBATCH -p`` with no value; a newline would add lines of
    its own to the job script)."""
    if not _SLURM_NAME.match(text):
        raise ValueError(f"{text[:60]!r} is not a SLURM name: letters, digits and "
                         "\"_.-+,\" only (leave the key out for the default)")
    return text


_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.+,-]+\Z")

# Config field types: the value as written, checked when the config is read.
SlurmName = Annotated[str, AfterValidator(slurm_name)]
MemoryAmount = Annotated[str, AfterValidator(memory_amount)]
Walltime = Annotated[str, BeforeValidator(toml_time_as_text), AfterValidator(walltime_text)]
# "" means: the default the field's comment names.
WalltimeOrDefault = Annotated[str, BeforeValidator(toml_time_as_text),
                              AfterValidator(lambda text: text and walltime_text(text))]


def memory_mib(text: str, key: str) -> int:
    """An amount of memory in MiB, the unit of SLURM's ``--mem``, rounded up: a job gets at
    least the bytes Dask reads from the same text. ValueError naming ``key`` otherwise."""
    try:
        return math.ceil(memory_bytes(text) / 2**20)
    except ValueError as exc:
        raise ValueError(f"{key} = {text!r}: {exc}") from None


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AdaptConfig(_Section):
    """``cluster.adapt = {minimum, maximum}``: SLURM jobs follow the task load."""

    minimum: StrictInt = Field(0, ge=0, description="the fewest worker jobs")
    maximum: StrictInt = Field(1, ge=1, description="the most worker jobs")

    @model_validator(mode="after")
    def _order(self) -> AdaptConfig:
        if self.minimum > self.maximum:
            raise ValueError(f"minimum {self.minimum} > maximum {self.maximum}")
        return self


#: The names of ``simpipe.cluster.server_kinds.SERVER_KINDS``, when this module was imported.
ServerKind = Literal[tuple(SERVER_KINDS)]  # type: ignore[valid-type]


class EmulatedServersConfig(_Section):
    """``[cluster.servers.emulated]``: GPU servers emulated by ``simpipe.servers.emulator``
    (``kind = "emulated"``, or any kind under ``simpipe run --emulate``)."""

    profile: str = Field("a100-llama3-8b", description=(
        "the timing profile, a name from `simpipe.servers.emulator_profiles`: "
        "`a100-llama3-8b`, `h100-llama3-8b`, `fast` ([emulator](emulator.md))"))
    params: dict[str, float] = Field(default_factory=dict, description=(
        "per-parameter overrides of the profile: `max_batch`, `max_batch_prefill_tokens`, "
        "`max_concurrent_requests`, `prefill_s_per_token`, `step_base_s`, `step_per_seq_s`, "
        "`prefix_caching` (1 or 0), `block_size`, `kv_cache_tokens`"))
    time_scale: FiniteFloat = Field(1.0, ge=TIME_SCALE_RANGE[0], le=TIME_SCALE_RANGE[1],
                                    description=(
        "the emulation runs this many times faster than the GPUs would; every figure it "
        "reports is GPU time"))
    gpus_per_process: int = Field(8, ge=1, le=MAX_GPUS_PER_PROCESS, description=(
        "emulated GPUs (servers, consecutive ports) per emulator process, i.e. per SLURM job"))
    protocol: Literal["tgi", "openai"] = Field("tgi", description=(
        "`tgi`: TGI's routes (and the OpenAI ones TGI also serves); `openai`: vLLM's OpenAI "
        "routes only"))
    model_id: str = Field("", description=(
        "the served model's name (`\"\"`: `cluster.servers.model`); with `openai`, another "
        "name gets vLLM's 404"))

    @model_validator(mode="after")
    def _known_profile(self) -> EmulatedServersConfig:
        get_profile(self.profile, self.params)  # ValueError naming a bad name or parameter
        return self


class ServersConfig(_Section):
    """``[cluster.servers]``: inference servers started as SLURM jobs next to the workers.

    Only ``cluster.kind = "slurm"`` starts server jobs; the other kinds run emulated servers
    (``kind = "emulated"``) as local processes. TGI servers feed ``agents.backend = "tgi"``,
    vLLM and llama.cpp servers ``agents.backend = "openai"``: their URLs (node address +
    port) replace ``agents.<backend>.endpoints``.
    """

    kind: ServerKind = Field(DEFAULT_SERVER_KIND, description=kind_description())
    model: str = Field("", description=(
        "model id (TGI, vLLM) or GGUF path (llama.cpp; `\"\"`: the embedded Gemma)"))
    command: str = Field("", description=(
        "the server's command line, a template with `{model} {host} {port} {gpus} {cpus} "
        "{python} {extra_args} {index}`; `\"\"`: the ready-made one for `kind`"))
    extra_args: str = Field("", description="appended to the command template's `{extra_args}`")
    nodes: StrictInt = Field(1, ge=1, description=(
        "nodes with servers; `nodes` x `per_node` servers in all, one SLURM job each"))
    per_node: StrictInt = Field(1, ge=1, description=(
        "servers per node: one per GPU on GPU nodes"))
    gpus_per_server: StrictInt = Field(0, ge=0, description=(
        "GPUs per server job (`--gres=gpu:N`); with `kind = \"emulated\"` the jobs ask for "
        "none and this only counts GPU-hours"))
    cpus_per_server: StrictInt = Field(1, ge=1, description="CPUs per server job")
    memory: MemoryAmount = Field("4GB", description="memory per server job")
    walltime: WalltimeOrDefault = Field("", description=(
        "per server job; `\"\"`: `cluster.walltime`"))
    port: StrictInt = Field(8300, ge=1, le=65535, description=(
        "server `i` listens on `port + i`"))
    host: str = Field("0.0.0.0", description="the servers' bind address on the node")
    container: Literal["none", "apptainer", "singularity"] = Field("none", description=(
        "run each server as `apptainer` or `singularity` `exec [--nv] ARGS IMAGE COMMAND`"))
    image: str = Field("", description="the container image (`.sif` or `docker://...`)")
    container_args: str = Field("", description=(
        "the container's `ARGS`, e.g. `\"--bind /scratch\"`"))
    startup_timeout_s: FiniteFloat = Field(900.0, gt=0, description=(
        "until every server answers `health_path` and `models_path` (model downloads and "
        "loads take minutes)"))
    health_path: str = Field("/health", description="health check; `\"\"` skips it")
    models_path: str = Field("/v1/models", description=(
        "second health check, the served models; `\"\"` skips it"))
    job_extra_directives: list[str] = Field(default_factory=list, description=(
        "extra `#SBATCH` lines of the server jobs, e.g. `[\"--constraint=a100\"]`"))
    job_script_prologue: list[str] = Field(default_factory=list, description=(
        "shell lines before each server starts (`module load ...`)"))
    batch_invariant: StrictBool = Field(False, description=(
        "start the servers in their batch-invariant mode (`vllm`: `VLLM_BATCH_INVARIANT=1`, "
        "beta, recent NVIDIA GPUs only): a request's output no longer depends on what else is "
        "in its batch, so with the per-request seed the same config gives the same guesses "
        "([same seed, same guesses](shared-answers.md#same-seed-same-guesses)); refused for "
        "kinds without such a mode"))
    emulated: EmulatedServersConfig = Field(EmulatedServersConfig(), description=(
        "the emulator's settings, for `kind = \"emulated\"` and for `--emulate`"))

    @model_validator(mode="after")
    def _consistent(self) -> ServersConfig:
        if self.plugin.needs_command and not self.command:
            raise ValueError(f'kind = "{self.kind}" needs command = "... --port {{port}} ..."')
        if self.plugin.needs_model and not self.model and not self.command:
            raise ValueError(f'kind = "{self.kind}" needs model = "<model id or path>"')
        if self.batch_invariant and not self.plugin.batch_invariant_env:
            able = [k.name for k in SERVER_KINDS.values() if k.batch_invariant_env]
            raise ValueError(f'batch_invariant = true: kind = "{self.kind}" has no '
                             f"batch-invariant mode (only {', '.join(able)})")
        if self.container != "none" and not self.image:
            raise ValueError(f'container = "{self.container}" needs image = "<.sif or docker://...>"')
        if self.port + self.nodes * self.per_node - 1 > 65535:
            raise ValueError(f"port {self.port} + {self.nodes * self.per_node} servers "
                             "passes 65535")
        return self

    @property
    def plugin(self) -> ServerKindPlugin:
        """The kind's entry in ``simpipe.cluster.server_kinds.SERVER_KINDS``."""
        return SERVER_KINDS[self.kind]

    @property
    def count(self) -> int:
        return self.nodes * self.per_node

    @property
    def endpoint_backend(self) -> str | None:
        """The ``agents.<backend>`` whose endpoints these servers are."""
        if self.plugin.emulator:
            # An emulator's protocol is named after the back-end whose requests it answers.
            return self.emulated.protocol
        return self.plugin.endpoint_backend

    @property
    def slots_per_server(self) -> int | None:
        """The requests each server decodes together, where its kind says and it starts with
        the kind's own command line (a ``command`` of one's own may start anything)."""
        if self.command:
            return None
        try:
            args = shlex.split(self.extra_args)
        except ValueError:  # an unclosed quote: the job script would fail to start it anyway
            return None
        return self.plugin.slots_of(args)

    @property
    def servers_per_job(self) -> int:
        """Servers (ports) one SLURM job runs: an emulator process holds several GPUs."""
        return self.emulated.gpus_per_process if self.plugin.emulator else 1


# The base of every kind's settings model (a kind is a ``simpipe.cluster.plugin.ClusterKind``):
# a subclass declares ``kind: Literal["<name>"] = "<name>"`` (the kind's name is read from
# that default) and its own keys only. Its docstring is the config reference's text.
class ClusterSettings(_Section):
    """Every kind also takes ``[cluster.servers]``, the inference servers its runs use."""

    servers: ServersConfig = Field(ServersConfig(), description=(
        "inference servers started for each run (or kept warm by `simpipe cluster up`)"))

    #: Whether this kind starts server jobs; the others run only emulated servers (as
    #: local processes).
    server_jobs: ClassVar[bool] = False

    @property
    def most_worker_processes(self) -> int | None:
        """The most Dask worker processes the kind runs at once (each opens its own
        connections to the servers); None where the config does not say."""
        return None

    @model_validator(mode="after")
    def _servers_run_here(self) -> ClusterSettings:
        if not self.server_jobs and self.servers.plugin.needs_slurm:
            kind = self.model_fields["kind"].default  # type: ignore[index]
            raise ValueError(f'cluster.servers.kind = "{self.servers.kind}" needs cluster.kind = '
                             f'"slurm" (servers run as SLURM jobs); set cluster.servers.kind = '
                             f'"none" with cluster.kind = "{kind}" (emulated servers also run '
                             "as local processes)")
        return self


class _WithDashboard(ClusterSettings):
    dashboard_address: str = Field("127.0.0.1:8787", description=(
        "the Dask dashboard, on loopback like `simpipe ui` (`ssh -L 8787:127.0.0.1:8787 "
        "login` to see it from elsewhere; `\":8787\"` for every interface); `\"\"` turns it "
        "off: no HTTP server listens at all"))

    @field_validator("dashboard_address")
    @classmethod
    def _dashboard_address(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if value and not (sep and port.isdigit() and int(port) <= 65535 and " " not in host):
            raise ValueError('expected "host:port" ("127.0.0.1:8787", ":8787" for every '
                             'interface) or "" for no dashboard')
        return value


class LocalClusterConfig(_WithDashboard):
    """``kind = "local"``: a ``distributed.LocalCluster`` of worker processes on this machine."""

    kind: Literal["local"] = "local"
    workers: StrictInt = Field(2, ge=1, description="worker processes")
    threads_per_worker: StrictInt = Field(1, ge=1, description=(
        "partitions a worker plays at once"))
    memory_limit: str = Field("auto", description=(
        "per worker, e.g. `\"4GiB\"`; `\"auto\"`: the machine's memory / workers"))

    @field_validator("memory_limit")
    @classmethod
    def _memory_limit(cls, value: str) -> str:
        return value if value == "auto" else memory_amount(value)

    @property
    def most_worker_processes(self) -> int | None:
        return self.workers


class AddressClusterConfig(ClusterSettings):
    """``kind = "address"``: an existing scheduler (``simpipe cluster up``, ``dask scheduler``)."""

    kind: Literal["address"] = "address"
    address: str | None = Field(None, description=(
        "the scheduler, e.g. `\"tcp://10.0.0.5:8786\"` (required)"))

    @model_validator(mode="after")
    def _has_address(self) -> AddressClusterConfig:
        if not self.address:
            raise ValueError('cluster.kind = "address" needs cluster.address = "tcp://host:port"')
        return self


class SlurmClusterConfig(_WithDashboard):
    """``kind = "slurm"``: dask_jobqueue.SLURMCluster; one job = ``processes`` workers sharing
    ``cores`` and ``memory``."""

    server_jobs: ClassVar[bool] = True

    kind: Literal["slurm"] = "slurm"
    queue: SlurmName | None = Field(None, description=(
        "the SLURM partition (`--partition`; several: `\"gpu,debug\"`); not set: the "
        "site's default"))
    account: SlurmName | None = Field(None, description=(
        "the SLURM account (`--account`); not set: the user's default"))
    walltime: Walltime = Field("01:00:00", description=(
        "per worker job (`HH:MM:SS`, `D-HH:MM:SS`)"))
    cores: StrictInt = Field(1, ge=1, description="per job, shared by its `processes`")
    memory: MemoryAmount = Field("2GB", description="per job, shared by its `processes`")
    processes: StrictInt = Field(1, ge=1, description="worker processes per job")
    jobs: StrictInt | None = Field(None, ge=1, description=(
        "a fixed number of worker jobs (0 would run nothing: use `adapt` for jobs that "
        "come and go); not set: 1, or none while `adapt` is set"))
    adapt: AdaptConfig | None = Field(None, description=(
        "`{ minimum = 0, maximum = 8 }` worker jobs, following the task load (instead of "
        "`jobs`)"))
    interface: str | None = Field(None, description=(
        "the workers' network interface (`\"ib0\"`, `\"lo\"`)"))
    scheduler_options: dict[str, Any] = Field(default_factory=dict, description=(
        "passed to the scheduler, e.g. `{ interface = \"eth0\", port = 8786 }`"))
    local_directory: str | None = Field(None, description=(
        "node-local scratch for the workers' spilling, e.g. `\"$TMPDIR\"`"))
    log_directory: str | None = Field(None, description=(
        "job stdout and stderr of the worker and server jobs; not set: `<run>/logs/slurm` "
        "(`simpipe cluster up`: `$SIMPIPE_HOME/clusters/<name>/logs`)"))
    job_extra_directives: list[str] = Field(default_factory=list, description=(
        "extra `#SBATCH` lines, e.g. `[\"--gres=gpu:1\", \"--constraint=a100\"]`"))
    job_script_prologue: list[str] = Field(default_factory=list, description=(
        "shell lines before the worker starts (`module load ...`, "
        "`source .venv/bin/activate`)"))
    python: str | None = Field(None, description=(
        "the Python the nodes run; not set: this interpreter"))
    start_timeout_s: FiniteFloat = Field(600.0, gt=0, description=(
        "for the first workers to connect"))
    worker_lifetime: str = Field("auto", description=(
        "the workers' `--lifetime`, so that Dask retires them before SLURM kills them at "
        "`walltime`; `\"auto\"`: end 5 % (>= 60 s) + the stagger before `walltime`; "
        "`\"none\"`; or a duration (`\"55m\"`)"))
    worker_lifetime_stagger: str = Field("auto", description=(
        "the workers' `--lifetime-stagger`; `\"auto\"`: 5 % of `walltime`, at most 5 min; "
        "`\"none\"`; or a duration"))

    @model_validator(mode="after")
    def _consistent(self) -> SlurmClusterConfig:
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
        self.worker_lifetime_args()  # raises if the lifetime does not fit the walltime
        return self

    @property
    def n_jobs(self) -> int:
        return self.jobs if self.jobs is not None else (0 if self.adapt else 1)

    @property
    def most_worker_processes(self) -> int | None:
        jobs = self.adapt.maximum if self.adapt is not None else self.n_jobs
        return jobs * self.processes

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
