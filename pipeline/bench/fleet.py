"""``simpipe bench fleet``: the GPU path at scale without GPUs.

The whole pipeline on the local SLURM: emulated GPU servers as SLURM jobs
(``cluster.servers.kind = "emulated"``, one job per emulated node with ``--gpus`` GPUs on
consecutive ports), Dask workers as SLURM jobs through dask-jobqueue (``--workers`` per
node), TGI's protocol (``agents.backend = "tgi"``). One row per round:

- ``wall_s``, ``agents_per_s``: the round as the run recorded it (``run.json``);
- ``ideal_s``: what the emulated fleet's modelled GPU work in that round needs on a
  perfectly fed, balanced fleet (``fleet_window``: work / GPUs), in real seconds at the
  time scale; ``wall_over_ideal`` = ``wall_s / ideal_s``;
- ``fleet_busy``: the share of the round (GPU time) the emulated GPUs had a running sequence;
- ``ramp_s`` / ``tail_s``: per GPU (mean, real seconds), from the round's start to its first
  running sequence, and from the last moment it had requests waiting to the round's end
  (``fleet_edges``): where a round barrier leaves the fleet underfed;
- ``pipeline_cpu_s_per_1k``: CPU seconds per 1,000 agents of the processes that are the
  pipeline: every Dask worker process and its nanny (read with ``client.run``) and this
  process (the client: scheduler, graph, reduce, run.json), between the round's start and
  its record; the emulated servers are not in it (``server_cpu_s_per_1k`` is theirs, from
  their ``/emulator/stats``). ``pipeline_cores`` = pipeline CPU / wall;
- ``worker_rss_gib``: the largest peak RSS (``ru_maxrss``) of any worker process so far.

``--weak-scaling`` runs 1, 2 and 4 emulated nodes with ``--agents-per-gpu`` agents per GPU and
prints the time per round against 1 node. ``--kill-server-at S`` cancels (``scancel``) the
last node's server job S seconds after the first round starts, then checks that every round
holds each agent exactly once and prints the killed endpoints' counters from ``run.json``.
"""

from __future__ import annotations

import json
import math
import resource
import shutil
import socket
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import pyarrow.dataset as ds

from simpipe.bench.scale import ATTRIBUTES
from simpipe.cluster import servers as srv
from simpipe.cluster import slurm
from simpipe.cluster.config import memory_amount
from simpipe.config.model import Config, config_from_dict
from simpipe.core.errors import SimpipeError
from simpipe.core.tables import markdown_table
from simpipe.inference.http.endpoints import emulate_node
from simpipe.run.console import Console
from simpipe.run.estimate import STATS_PATH, fetch_stats, fleet_edges, fleet_window
from simpipe.run.executor import Executor
from simpipe.run.simulation import RoundObserver, run_simulation
from simpipe.servers.emulator_profiles import get_profile
from simpipe.store.record import RunRecord
from simpipe.store.results import read_ledger
from simpipe.store.round_record import RoundRecord

DEFAULT_PORT = 19300
WEAK_NODES = (1, 2, 4)


class FleetError(SimpipeError, ValueError):
    """A bench option that cannot work; the message names the option."""


@dataclass(frozen=True)
class FleetCase:
    agents: int = 100_000
    rounds: int = 2
    nodes: int = 1  # emulated nodes: one server job (``gpus`` GPUs) + ``workers`` worker jobs
    gpus: int = 1  # emulated GPUs per node
    profile: str = "fast"
    time_scale: float = 1.0
    workers: int = 1  # worker jobs (one process each) per node
    threads: int = 2  # partitions a worker plays at once
    partitions: int = 0  # 0: auto
    max_concurrency: int = 0  # requests in flight per endpoint per worker process; 0: auto
    worker_memory: str = "3GB"
    port: int = 0  # the first server's port; 0: the first free range from DEFAULT_PORT
    kill_server_at: float | None = None  # seconds after the first round starts

    def __post_init__(self) -> None:

        for option, check, value in (("--profile", get_profile, self.profile),
                                     ("--worker-memory", memory_amount, self.worker_memory)):
            try:
                check(value)
            except ValueError as exc:
                raise FleetError(f"{option} {value}: {exc}") from None
        if self.kill_server_at is not None and self.nodes < 2:
            raise FleetError("--kill-server-at needs --nodes 2 or more: it cancels one node's "
                             "server job, and the others must carry the round")

    @property
    def n_partitions(self) -> int:
        if self.partitions:
            return min(self.partitions, self.agents)
        threads = self.nodes * self.workers * self.threads
        return min(self.agents, max(4 * threads, math.ceil(self.agents / 50_000)))

    @property
    def concurrency(self) -> int:
        """Requests in flight per endpoint per worker. Measured on 4 A100-profile GPUs and
        100,000 agents: 64 kept them busy but in small batches (1.08-1.10 x the ideal
        round), 256 (one full batch) 1.03, 512 no better (1.03-1.05, twice the
        connections). Fewer when all workers together could pass a server's 429 limit."""
        if self.max_concurrency:
            return self.max_concurrency

        limit = get_profile(self.profile).max_concurrent_requests
        return max(1, min(256, limit // (self.nodes * self.workers)))


def fleet_config(case: FleetCase, output_dir: Path, port: int) -> Config:
    name = f"fleet-{case.agents}-{case.nodes}n{case.gpus}g"
    return config_from_dict({
        "run": {"name": name, "seed": 7, "output_dir": str(output_dir)},
        "population": {"size": case.agents, "partitions": case.n_partitions,
                       "attributes": ATTRIBUTES},
        "game": {"rounds": case.rounds},
        "agents": {"backend": "tgi",
                   "tgi": {"max_concurrency": case.concurrency, "timeout_s": 300}},
        "cluster": {
            "kind": "slurm", "jobs": case.nodes * case.workers, "cores": case.threads,
            "processes": 1, "memory": case.worker_memory, "walltime": "04:00:00",
            "interface": "lo", "dashboard_address": "", "start_timeout_s": 180,
            # A worker's threads mostly wait on its one event loop: book one CPU per worker
            # job (sbatch takes the last --cpus-per-task), so 4 nodes' jobs fit the local
            # SLURM's 2 CPUs x 4 shares.
            "job_extra_directives": ["--cpus-per-task=1"],
            "servers": {
                "kind": "emulated", "nodes": case.nodes, "per_node": case.gpus,
                "memory": "1GB", "port": port, "startup_timeout_s": 180,
                "emulated": {"profile": case.profile, "time_scale": case.time_scale,
                             "gpus_per_process": case.gpus},
            },
        },
    })


def free_port_range(count: int, start: int = DEFAULT_PORT) -> int:
    """The first port from ``start`` with ``count`` consecutive ports free on this machine
    (the local SLURM's node is this machine)."""
    port = start
    while port + count <= 65535:
        if all(_port_free(p) for p in range(port, port + count)):
            return port
        port += count
    raise FleetError(f"no {count} consecutive free ports from {start}; pass --port")


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        # As a server binds (asyncio sets it): a port an ended run left in TIME_WAIT is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


# --- measurements ---------------------------------------------------------------------------

def process_usage() -> tuple[float, int]:
    """(CPU seconds, peak RSS bytes) of the calling process; run on workers and nannies."""
    cpu = psutil.Process().cpu_times()
    return cpu.user + cpu.system, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def server_cpu_s(urls: list[str]) -> float:
    """CPU seconds so far of the emulator processes behind ``urls`` (each counted once)."""
    total, seen = 0.0, set()
    for url in urls:
        try:
            with urllib.request.urlopen(url + STATS_PATH, timeout=10) as resp:
                stats = json.loads(resp.read())
            key = (url.rsplit(":", 1)[0], tuple(stats["ports"]))
            if key not in seen:
                seen.add(key)
                total += float(stats["process_cpu_s"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a server that is gone (killed on purpose) costs nothing more
    return total


@dataclass
class _RoundUsage:
    workers_cpu_s: float = 0.0  # worker processes and their nannies
    client_cpu_s: float = 0.0  # this process: client, scheduler, reduce, run.json
    server_cpu_s: float = 0.0
    worker_rss: int = 0

    @property
    def pipeline_cpu_s(self) -> float:
        return self.workers_cpu_s + self.client_cpu_s


@dataclass
class FleetObserver(RoundObserver):
    """Pipeline CPU (workers, nannies, this process) and server CPU around each round."""

    client: Any
    urls: list[str]
    on_first_round: Callable[[], None] | None = None
    usage: dict[int, _RoundUsage] = field(default_factory=dict)
    _start: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def _pipeline(self) -> tuple[float, float, int]:
        """(workers' and nannies' CPU, this process's CPU, the largest worker peak RSS)."""
        workers = self.client.run(process_usage)
        nannies = self.client.run(process_usage, nanny=True)
        cpu = sum(c for c, _ in workers.values()) + sum(c for c, _ in nannies.values())
        rss = max((r for _, r in workers.values()), default=0)
        return cpu, process_usage()[0], rss

    def round_started(self, round_index: int) -> None:
        servers = server_cpu_s(self.urls)
        workers, client, _ = self._pipeline()  # the pipeline's last: nearest the round
        self._start = (workers, client, servers)
        if self.on_first_round is not None:
            self.on_first_round()
            self.on_first_round = None

    def round_finished(self, round_index: int, record: RoundRecord) -> None:
        workers, client, rss = self._pipeline()
        servers = server_cpu_s(self.urls)
        w0, c0, s0 = self._start
        self.usage[round_index] = _RoundUsage(workers - w0, client - c0, servers - s0, rss)


# --- one case -------------------------------------------------------------------------------

@dataclass
class KillReport:
    at_s: float = 0.0  # seconds after the first round started
    job_id: str = ""
    urls: list[str] = field(default_factory=list)
    round: int | None = None  # 1-based round it happened in


@dataclass
class CaseResult:
    case: FleetCase
    rows: list[dict]
    run_dir: Path
    ledger: RunRecord
    kill: KillReport | None = None
    problems: list[str] = field(default_factory=list)
    kill_lines: list[str] = field(default_factory=list)


def run_fleet_case(case: FleetCase, workdir: Path,
                   log: Callable[[str], None] = lambda _: None) -> CaseResult:
    """Start the emulated servers and the workers on SLURM, run, measure, stop everything."""
    port = case.port or free_port_range(case.nodes * case.gpus)
    config = fleet_config(case, workdir, port)
    log(f"fleet: {case.nodes} node(s) x {case.gpus} emulated GPU(s) ({case.profile}, time "
        f"scale {case.time_scale:g}), {case.nodes * case.workers} worker job(s) x "
        f"{case.threads} thread(s), {case.agents:,} agents in {case.n_partitions} partitions, "
        f"max_concurrency {case.concurrency}")
    kill = KillReport() if case.kill_server_at is not None else None
    # The executor submits the server jobs, starts the worker jobs while they load, and
    # cancels both when the case ends.
    with Executor(config, say=log, name=f"bench-fleet-{port}") as executor:
        servers, urls, client = executor.servers, executor.endpoints, executor.client
        if case.nodes > 1:
            pin_nodes(client, servers, case.workers)
        started = [0.0]
        timer: threading.Timer | None = None

        def first_round() -> None:
            nonlocal timer
            started[0] = time.time()
            if kill is not None:
                victim = servers[-1].job_id
                kill.job_id = victim
                kill.urls = [s.url for s in servers if s.job_id == victim]
                timer = threading.Timer(case.kill_server_at, _kill, (victim, kill, started))
                timer.start()

        observer = FleetObserver(client, urls, first_round)
        try:
            result = run_simulation(config, executor=executor, console=Console(quiet=True),
                                    observer=observer)
        finally:
            if timer is not None:
                timer.cancel()
        stats, problems = fetch_stats(urls)
    ledger = read_ledger(result.run_dir)
    if kill is not None and kill.at_s:
        kill.round = _round_at(ledger, started[0] + kill.at_s)
    rows = _rows(case, ledger, stats, observer.usage)
    return CaseResult(case, rows, result.run_dir, ledger, kill, problems)


def pin_nodes(client: Any, servers: list[srv.Server], workers_per_node: int) -> None:
    """Each worker process gets an emulated node: node ``j`` is server job ``j`` and the
    ``j``-th ``workers_per_node`` workers; a worker prefers its node's servers."""
    nodes: dict[str, list[str]] = {}
    for server in servers:  # in launch order: job j holds node j's servers
        nodes.setdefault(server.job_id, []).append(server.url)
    urls = list(nodes.values())
    for k, address in enumerate(sorted(client.scheduler_info(n_workers=-1)["workers"])):
        client.run(emulate_node, urls[min(k // workers_per_node, len(urls) - 1)],
                   workers=[address])


def _kill(job_id: str, report: KillReport, started: list[float]) -> None:
    report.at_s = time.time() - started[0]
    slurm.cancel([job_id])


def _round_at(ledger: RunRecord, unix_time: float) -> int | None:
    for r, rec in ledger.finished_rounds().items():
        start = rec.started_at or 0.0
        if start <= unix_time <= start + (rec.elapsed_s or 0.0):
            return r + 1
    return None


def _rows(case: FleetCase, ledger: RunRecord, stats: list,
          usage: dict[int, _RoundUsage]) -> list[dict]:
    rows = []
    gpus_read = len(stats)
    for r, rec in ledger.finished_rounds().items():
        wall, n, started = rec.elapsed_s or 0.0, rec.n, rec.started_at or 0.0
        window = fleet_window(stats, started, started + wall)
        ideal = sum(window["work_s"]) / gpus_read / case.time_scale if gpus_read else 0.0
        busy = (sum(window["busy_s"]) / (gpus_read * wall * case.time_scale)
                if gpus_read and wall else 0.0)
        edges = fleet_edges(stats, started, started + wall)
        ramp, tail = (sum(v) / len(v) / case.time_scale if v else None
                      for v in (edges["ramp_s"], edges["tail_s"]))
        use = usage.get(r, _RoundUsage())
        rows.append({
            "nodes": case.nodes, "gpus": case.nodes * case.gpus, "round": r + 1, "agents": n,
            "errors": rec.n_error, "wall_s": wall,
            "agents_per_s": n / wall if wall else None, "ideal_s": ideal,
            "wall_over_ideal": wall / ideal if ideal else None, "fleet_busy": busy,
            "ramp_s": ramp, "tail_s": tail,
            "pipeline_cpu_s_per_1k": 1000 * use.pipeline_cpu_s / n if n else None,
            "pipeline_cores": use.pipeline_cpu_s / wall if wall else None,
            "client_cpu_s_per_1k": 1000 * use.client_cpu_s / n if n else None,
            "server_cpu_s_per_1k": 1000 * use.server_cpu_s / n if n else None,
            "worker_rss_gib": use.worker_rss / 2**30,
        })
    return rows


FORMATS = {
    "agents": "{:,}", "wall_s": "{:.2f}", "agents_per_s": "{:,.0f}", "ideal_s": "{:.2f}",
    "wall_over_ideal": "{:.3f}", "fleet_busy": "{:.3f}", "pipeline_cpu_s_per_1k": "{:.3f}",
    "pipeline_cores": "{:.2f}", "client_cpu_s_per_1k": "{:.3f}",
    "server_cpu_s_per_1k": "{:.3f}", "worker_rss_gib": "{:.2f}",
    "round_s": "{:.2f}", "ratio_to_1_node": "{:.3f}", "ramp_s": "{:.2f}", "tail_s": "{:.2f}",
}


def format_rows(rows: list[dict]) -> str:
    return markdown_table(rows, FORMATS)


def weak_scaling_rows(results: list[CaseResult]) -> list[dict]:
    """Per node count: the mean round time and its ratio to 1 node."""
    base = None
    out = []
    for res in results:
        rows = res.rows
        round_s = sum(r["wall_s"] for r in rows) / len(rows) if rows else float("nan")
        base = base or round_s
        out.append({
            "nodes": res.case.nodes, "gpus": res.case.nodes * res.case.gpus,
            "agents": res.case.agents, "rounds": len(rows), "round_s": round_s,
            "ratio_to_1_node": round_s / base,
            "fleet_busy": min((r["fleet_busy"] for r in rows), default=None),
            "wall_over_ideal": max((r["wall_over_ideal"] or 0 for r in rows), default=None),
            "pipeline_cores": max((r["pipeline_cores"] or 0 for r in rows), default=None),
        })
    return out


def kill_lines(res: CaseResult, rows_per_round: dict[int, tuple[int, int]]) -> list[str]:
    """What a killed server did to the run: rows per round and the endpoints' counters."""
    kill = res.kill
    if kill is None:
        return []
    lines = []
    if not kill.at_s:
        lines.append(f"kill: the run ended before {res.case.kill_server_at:g} s; no server "
                     "was killed")
        return lines
    where = f"during round {kill.round}" if kill.round else "between rounds"
    lines.append(f"kill: scancel {kill.job_id} ({', '.join(kill.urls)}) at {kill.at_s:.1f} s, "
                 f"{where}")
    for r, (rows, unique) in sorted(rows_per_round.items()):
        lines.append(f"round {r}: {rows:,} rows, {unique:,} distinct agents "
                     f"(expected {res.case.agents:,})")
    endpoints = res.ledger.endpoints
    for url in kill.urls:
        c = endpoints.get(url, {})
        lines.append(f"{url}: requests {c.get('requests', 0):,}, errors "
                     f"{c.get('errors', 0):,}, retries {c.get('retries', 0):,}, marked down "
                     f"{c.get('marked_down', 0):,}")
    return lines


def rows_per_round(run_dir: Path) -> dict[int, tuple[int, int]]:
    """(rows, distinct agent ids) of every round on disk, by its folder's number (a run this
    version starts numbers them from 1)."""

    out = {}
    for part in sorted((run_dir / "rounds").glob("round=*")):
        ids = ds.dataset(part, format="parquet").to_table(columns=["agent_id"])
        column = ids.column("agent_id")
        out[int(part.name.split("=")[1])] = (len(column), len(column.unique()))
    return out


@contextmanager
def bench_dir(keep: str | None):
    """Where a case's run goes: ``keep`` (kept), or a temporary directory (removed)."""
    if keep:
        path = Path(keep)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix="simpipe-fleet-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def weak_cases(case: FleetCase, agents_per_gpu: int) -> list[FleetCase]:
    return [replace(case, nodes=n, agents=agents_per_gpu * case.gpus * n) for n in WEAK_NODES]


def run_bench(case: FleetCase, *, weak_scaling: bool = False, agents_per_gpu: int = 10_000,
              keep: str | None = None, echo: Callable[[str], None] = print,
              log: Callable[[str], None] = lambda _: None) -> list[CaseResult]:
    """The command: one case (or the weak-scaling cases), its table and, after a kill, the
    rows and counters that show what the loss cost."""
    cases = weak_cases(case, agents_per_gpu) if weak_scaling else [case]
    results = []
    with bench_dir(keep) as workdir:
        for one in cases:
            res = run_fleet_case(one, workdir, log)
            results.append(res)
            for problem in res.problems:
                log(f"stats: {problem}")
            if res.kill is not None:
                res.kill_lines = kill_lines(res, rows_per_round(res.run_dir))
    echo(format_rows([row for res in results for row in res.rows]))
    if weak_scaling:
        echo("")
        echo(format_rows(weak_scaling_rows(results)))
    for res in results:
        for line in res.kill_lines:
            echo(line)
    return results

