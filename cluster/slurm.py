"""Thin wrappers over the SLURM commands (sinfo, sbatch, squeue, scancel, scontrol).

Commands rather than a library: they are what every SLURM site has, they honour SLURM_CONF,
and their errors are the ones users search for.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from enum import StrEnum

from simpipe.cluster.config import ClusterSettings, SlurmClusterConfig
from simpipe.core.errors import SimpipeError


class SlurmError(SimpipeError, RuntimeError):
    """A SLURM command failed; the message names the command and SLURM's own words."""


class NotSlurm(SimpipeError, ValueError):
    """A command that only runs on SLURM got another ``cluster.kind``."""


def require_slurm(cluster: ClusterSettings, command: str) -> SlurmClusterConfig:
    """``[cluster]`` as the SLURM settings it must be, else NotSlurm naming ``command``
    (e.g. "simpipe sbatch") and the kind it got: the one check of every SLURM-only command,
    and the narrowing that lets it read the SLURM keys, typed."""
    if not isinstance(cluster, SlurmClusterConfig):
        raise NotSlurm(f'{command} needs cluster.kind = "slurm" (got "{cluster.kind}")')
    return cluster


def _run(args: list[str], *, input_text: str | None = None, timeout: float = 30.0) -> str:
    if shutil.which(args[0]) is None:
        raise SlurmError(f"{args[0]} not found: install SLURM's client commands "
                         "(Debian: apt-get install slurm-client) or load its module")
    try:
        proc = subprocess.run(args, input=input_text, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(args)} did not answer within {timeout:g} s") from None
    if proc.returncode != 0:
        raise SlurmError(f"{' '.join(args[:2])}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def controller_problem(timeout: float = 15.0) -> str | None:
    """None when ``sinfo`` reaches a controller, else why not (one line)."""
    if shutil.which("sinfo") is None:
        return "sinfo not found (SLURM client commands are not installed)"
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"sinfo did not answer within {timeout:g} s"
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or ["sinfo failed"])[-1]
    return None


def require_controller() -> None:
    """Raise SlurmError with the fix when no controller answers."""
    problem = controller_problem()
    if problem:
        raise SlurmError(
            f'cluster.kind = "slurm" but sinfo cannot reach a controller ({problem}): run '
            "`bash cluster/local-slurm.sh up` on a workstation, or check SLURM_CONF"
        )


def submit(script: str) -> str:
    """``sbatch`` a script given as text; the job id."""
    out = _run(["sbatch", "--parsable"], input_text=script)
    return out.strip().split(";")[0]


def sbatch_words(output: str) -> str:
    """sbatch's reason on one line: its ``error:`` lines (else its last line), without the
    ``sbatch: error:`` prefixes."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line.split("error:", 1)[1].strip() for line in lines if "error:" in line]
    return "; ".join(errors or lines[-1:]) or "no reason given"


def dry_submit(script: str, timeout: float = 30.0) -> str | None:
    """Why sbatch would refuse ``script`` (``sbatch --test-only``: the partition, account,
    resources and time limit are checked, nothing is queued), in sbatch's own words; None
    when it would take it."""
    if shutil.which("sbatch") is None:
        return "sbatch not found (SLURM client commands are not installed)"
    try:
        proc = subprocess.run(["sbatch", "--test-only"], input=script, capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"sbatch --test-only did not answer within {timeout:g} s"
    if proc.returncode != 0:
        return sbatch_words(proc.stderr or proc.stdout)
    return None


def cancel(job_ids: list[str] | tuple[str, ...]) -> None:
    job_ids = list(dict.fromkeys(job_ids))  # one emulator job serves several endpoints
    if job_ids:
        try:
            _run(["scancel", *job_ids])
        except SlurmError as exc:
            # Jobs that already ended are no error for a clean-up.
            if "Invalid job id" not in str(exc):
                raise


class SlurmJobState(StrEnum):
    """The SLURM job states simpipe acts on (squeue's ``%T`` words). SLURM has more
    (COMPLETING, CONFIGURING, SUSPENDED, ...), so ``JobInfo.state`` keeps the word squeue
    gave and is compared with these; a different state machine from a run's
    (``simpipe.store.states``) or a persistent cluster's (``simpipe.cluster.state``)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"


#: The states of a job that will never run (again): its servers are gone.
ENDED_JOB_STATES = frozenset({
    SlurmJobState.COMPLETED, SlurmJobState.FAILED, SlurmJobState.CANCELLED,
    SlurmJobState.TIMEOUT, SlurmJobState.NODE_FAIL, SlurmJobState.PREEMPTED,
    SlurmJobState.OUT_OF_MEMORY, SlurmJobState.BOOT_FAIL, SlurmJobState.DEADLINE})


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    name: str
    state: str  # squeue's word: a SlurmJobState or another of SLURM's
    time_left: str
    nodes: str  # node list ("" while pending)


def jobs(job_ids: list[str] | None = None, name: str | None = None) -> dict[str, JobInfo]:
    """Jobs still known to squeue (ended jobs drop out after MinJobAge)."""
    args = ["squeue", "-h", "-o", "%i|%j|%T|%L|%N"]
    if job_ids is not None:
        if not job_ids:
            return {}
        args += ["-j", ",".join(job_ids)]
    if name is not None:
        args += ["--name", name]
    try:
        out = _run(args)
    except SlurmError as exc:
        if "Invalid job id" in str(exc):  # every id already purged
            return {}
        raise
    result = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 5:
            result[parts[0]] = JobInfo(*parts)
    return result


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    cpus: int  # per node (the largest node's)
    memory_mb: int  # per node
    nodes: str  # node list


def partitions() -> list[Partition]:
    """What ``sinfo`` reports per partition (and node size)."""
    out = _run(["sinfo", "-h", "-o", "%P|%c|%m|%N"])
    found: dict[str, Partition] = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) != 4:
            continue
        name, cpus, mem, nodes = parts
        default = name.endswith("*")
        name = name.rstrip("*")
        try:
            cpus_n, mem_n = int(cpus.rstrip("+")), int(mem.rstrip("+"))
        except ValueError:
            continue
        old = found.get(name)
        if old is None or cpus_n > old.cpus:
            found[name] = Partition(name, default, cpus_n, mem_n, nodes)
    return list(found.values())


def node_address(node: str) -> str:
    """The address a node is reached at (its NodeAddr), for endpoint URLs."""
    out = _run(["scontrol", "show", "node", node, "-o"])
    for field in out.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    return node


def expand_nodelist(nodelist: str) -> list[str]:
    """``node[01-03]`` -> ``["node01", "node02", "node03"]``."""
    return _run(["scontrol", "show", "hostnames", nodelist]).split()


def placement_directives(queue: str | None, account: str | None, gpus: int) -> list[str]:
    """The ``#SBATCH`` lines that say where a job may run: partition, account, GPUs."""
    lines = []
    if queue:
        lines.append(f"#SBATCH --partition={queue}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    if gpus:
        lines.append(f"#SBATCH --gres=gpu:{gpus}")
    return lines
