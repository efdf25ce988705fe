"""What the real run would take, from a dry run against emulated GPU servers (``--emulate``).

Each emulated GPU reports (``GET /emulator/stats``) cumulative modelled counters sampled over
time: ``busy_s`` (time with at least one running sequence) and ``work_s`` (what its finished
requests cost on a full batch: ``simpipe.inference.cost_model.CostModel.request_cost_s``, the
price list the round plan chooses by). For each round, between its start and end on the client's
clock (``started_at``, ``elapsed_s`` in ``run.json``), this module takes per GPU:

- ``busy``: the GPU time that round kept it busy, with the batches the pipeline gave it;
- ``work``: the GPU time a fully fed GPU needs for the same requests.

Then per round: the fleet's busy share of the modelled round (``wall * time_scale``); the
ideal fleet time ``sum(work) / GPUs`` (a perfectly fed, balanced fleet); and the estimate
``max(wall, busiest GPU's busy time)``: the GPUs need at least their busy time (at 1x), the
pipeline at least the wall time it took here. The round's limit is the GPUs when the busiest
GPU was busy for at least 80 % of that estimate, else the pipeline (at its agents/s). The
run's estimate adds the population build, as measured here; server start-up (model download
and load) is not in it. GPU-hours count every GPU for the whole estimated run.

A later benchmark can call ``fleet_window`` for any interval of its own.
"""

from __future__ import annotations

import bisect
import json
import math
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simpipe.core.tables import markdown_table

if TYPE_CHECKING:  # only the annotation: the dry run's maths stays free of the run's files
    from simpipe.store.record import RunRecord

STATS_PATH = "/emulator/stats"
MAX_STATS_BYTES = 32 * 2**20
TIMEOUT_S = 10.0
GPU_BOUND_SHARE = 0.8
_NUMBERS = ("started_unix", "time_scale", "now_s", "busy_s", "work_s", "completed")


class StatsError(ValueError):
    """An emulator's stats are missing or malformed; the message names the URL."""


@dataclass
class GpuStats:
    """One emulated GPU's counters over time (modelled seconds since its start)."""

    url: str
    started_unix: float
    time_scale: float
    times: list[float]  # modelled time of each sample, ascending
    cumulative: list[tuple[float, float, int]]  # (busy_s, work_s, completed) per sample
    profile: dict
    # (running, queued) per sample; (0, 0) where an older emulator's series lacks them
    load: list[tuple[float, float]] = field(default_factory=list)

    def at(self, unix_time: float) -> tuple[float, float, float]:
        """Cumulative (busy_s, work_s, completed) at a client clock time, interpolated."""
        t = (unix_time - self.started_unix) * self.time_scale
        i = bisect.bisect_right(self.times, t)
        if i == 0:
            return 0.0, 0.0, 0.0  # before the first sample: counting from zero at start
        if i == len(self.times):
            return tuple(float(v) for v in self.cumulative[-1])  # type: ignore[return-value]
        t0, t1 = self.times[i - 1], self.times[i]
        a, b = self.cumulative[i - 1], self.cumulative[i]
        f = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
        return tuple(x + (y - x) * f for x, y in zip(a, b, strict=True))  # type: ignore[return-value]


def parse_stats(url: str, data: Any) -> GpuStats:
    """Validate an ``/emulator/stats`` answer (untrusted input); StatsError if malformed."""
    if not isinstance(data, dict):
        raise StatsError(f"{url}{STATS_PATH}: not a JSON object")
    for key in _NUMBERS:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
                value) or value < 0:
            raise StatsError(f"{url}{STATS_PATH}: {key} = {value!r} is not a number >= 0")
    if data["time_scale"] <= 0:
        raise StatsError(f"{url}{STATS_PATH}: time_scale must be > 0")
    columns = data.get("series_columns")
    series = data.get("series")
    if not isinstance(columns, list) or not isinstance(series, list):
        raise StatsError(f"{url}{STATS_PATH}: no series")
    try:
        ti, bi, wi, ci = (columns.index(c) for c in ("t_s", "busy_s", "work_s", "completed"))
        ri, qi = (columns.index(c) if c in columns else None for c in ("running", "queued"))
        rows = [(float(r[ti]), float(r[bi]), float(r[wi]), float(r[ci]),
                 float(r[ri]) if ri is not None else 0.0,
                 float(r[qi]) if qi is not None else 0.0) for r in series]
        rows.append((float(data["now_s"]), float(data["busy_s"]), float(data["work_s"]),
                     float(data["completed"]), float(data.get("running") or 0),
                     float(data.get("queued") or 0)))
    except (ValueError, TypeError, IndexError) as exc:
        raise StatsError(f"{url}{STATS_PATH}: malformed series ({exc})") from None
    rows = [r for r in rows if all(math.isfinite(v) for v in r)]
    rows.sort()
    profile = data.get("profile") if isinstance(data.get("profile"), dict) else {}
    return GpuStats(url, float(data["started_unix"]), float(data["time_scale"]),
                    [r[0] for r in rows], [r[1:4] for r in rows], profile,
                    [r[4:] for r in rows])


def fetch_stats(urls: Sequence[str]) -> tuple[list[GpuStats], list[str]]:
    """Each URL's stats, and one line per URL whose stats could not be read."""
    stats, problems = [], []
    for url in urls:
        try:
            with urllib.request.urlopen(url.rstrip("/") + STATS_PATH,
                                        timeout=TIMEOUT_S) as resp:
                raw = resp.read(MAX_STATS_BYTES + 1)
            if len(raw) > MAX_STATS_BYTES:
                raise StatsError(f"{url}{STATS_PATH}: answer larger than {MAX_STATS_BYTES} B")
            stats.append(parse_stats(url, json.loads(raw)))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            problems.append(str(exc) if isinstance(exc, StatsError)
                            else f"{url}{STATS_PATH}: {exc}")
    return stats, problems


def fleet_window(stats: Sequence[GpuStats], start_unix: float, end_unix: float) -> dict:
    """The fleet between two client clock times: per-GPU busy, work and finished requests."""
    busy, work, done = [], [], 0.0
    for gpu in stats:
        b0, w0, c0 = gpu.at(start_unix)
        b1, w1, c1 = gpu.at(end_unix)
        busy.append(b1 - b0)
        work.append(w1 - w0)
        done += c1 - c0
    return {"busy_s": busy, "work_s": work, "completed": done}


def fleet_edges(stats: Sequence[GpuStats], start_unix: float,
                end_unix: float) -> dict[str, list[float]]:
    """Where a round left the fleet underfed, per GPU in modelled seconds: ``ramp_s`` from the
    round's start to its first sample with a sequence running, ``tail_s`` from its last
    sample with requests waiting (more work than it could run) to the round's end. A GPU
    with no such sample in the round (a fleet too fast to be caught busy) is left out."""
    ramp, tail = [], []
    for gpu in stats:
        t0 = (start_unix - gpu.started_unix) * gpu.time_scale
        t1 = (end_unix - gpu.started_unix) * gpu.time_scale
        inside = [(t, load) for t, load in zip(gpu.times, gpu.load, strict=True) if t0 <= t <= t1]
        running = [t for t, (r, _) in inside if r > 0]
        queued = [t for t, (_, q) in inside if q > 0]
        if running:
            ramp.append(running[0] - t0)
        if queued:
            tail.append(t1 - queued[-1])
    return {"ramp_s": ramp, "tail_s": tail}


def estimate(ledger: RunRecord, stats: Sequence[GpuStats], gpus_per_server: int = 1,
             server_count: int | None = None) -> dict:
    """The ``estimate`` record of ``run.json`` for the rounds the emulators saw
    (``server_count``: the configured servers, when some could not be read)."""
    n_servers = len(stats)
    scale = stats[0].time_scale if stats else 1.0
    rounds, unseen = [], []
    finished = ledger.finished_rounds()
    for key, rec in finished.items():
        started, wall = rec.started_at, rec.elapsed_s
        if started is None or wall is None or any(started < s.started_unix for s in stats):
            unseen.append(key + 1)  # an earlier invocation's round (--resume), from 1
            continue
        window = fleet_window(stats, started, started + wall)
        busiest = max(window["busy_s"], default=0.0)
        modelled = wall * scale
        estimate_s = max(wall, busiest)
        rounds.append({
            "round": key + 1,
            "agents": rec.n,
            "wall_s": wall,
            "fleet_busy": _r(sum(window["busy_s"]) / (n_servers * modelled) if modelled else 0),
            "busiest_gpu_s": _r(busiest),
            "ideal_s": _r(sum(window["work_s"]) / n_servers if n_servers else 0.0),
            "estimate_s": _r(estimate_s),
            "limit": "GPUs" if busiest >= GPU_BOUND_SHARE * estimate_s else "pipeline",
            "pipeline_agents_per_s": _r(rec.n / wall) if wall else None,
        })
    population_s = ledger.timing("population_s")
    total_s = population_s + sum(r["estimate_s"] for r in rounds)
    gpus = (server_count or n_servers) * max(1, gpus_per_server)
    agents = sum(r["agents"] for r in rounds)
    ideal = sum(r["ideal_s"] for r in rounds)
    pipeline_rounds = [r for r in rounds if r["limit"] == "pipeline"]
    return {
        "profile": stats[0].profile.get("name") if stats else None,
        "gpu": stats[0].profile.get("gpu") if stats else None,
        "time_scale": scale,
        "servers": server_count or n_servers,
        "servers_read": n_servers,
        "gpus": gpus,
        "rounds": rounds,
        "rounds_not_seen": unseen,
        "population_s": population_s,
        "total_s": _r(total_s),
        "gpu_hours": _r(gpus * total_s / 3600),
        "tokens_in": sum(finished[r["round"] - 1].tokens_in for r in rounds),
        "tokens_out": sum(finished[r["round"] - 1].tokens_out for r in rounds),
        "limit": "pipeline" if len(pipeline_rounds) * 2 > len(rounds) else "GPUs",
        "pipeline_agents_per_s": (_r(sum(r["agents"] for r in pipeline_rounds)
                                     / sum(r["wall_s"] for r in pipeline_rounds))
                                  if pipeline_rounds else None),
        "fleet_agents_per_s": _r(agents / ideal) if ideal else None,
        "excludes": "server start-up (model download and load)",
    }


def _r(value: float) -> float:
    return float(f"{value:.6g}")  # six significant digits: readable run.json, no false precision


FORMATS = {"wall_s": "{:.1f}", "fleet_busy": "{:.0%}", "busiest_gpu_s": "{:.1f}",
           "ideal_s": "{:.1f}", "estimate_s": "{:.1f}", "pipeline_agents_per_s": "{:,.0f}",
           "agents": "{:,}"}


def format_estimate(est: dict) -> str:
    """A short table per round and the run's totals, for the console."""
    lines = [f"Estimate for the real run ({est['servers']} x {est['gpu']}, profile "
             f"{est['profile']}, emulated at time scale {est['time_scale']:g}):"]
    lines.append(markdown_table(est["rounds"], FORMATS))
    if est["rounds_not_seen"]:
        lines.append(f"rounds {est['rounds_not_seen']} ran before these emulators started: "
                     "not estimated")
    h, m = divmod(est["total_s"] / 60, 60)
    lines.append(f"whole run: {est['total_s']:,.0f} s ({int(h)} h {m:.0f} min, population "
                 f"build {est['population_s']:.1f} s included), {est['gpu_hours']:,.2f} "
                 f"GPU-hours on {est['gpus']} GPUs, {est['tokens_in']:,} tokens in, "
                 f"{est['tokens_out']:,} out; excludes {est['excludes']}")
    fleet = est["fleet_agents_per_s"]
    fleet_text = f"a fully fed fleet would do {fleet:,.0f} agents/s" if fleet else ""
    if est["limit"] == "pipeline" and est["pipeline_agents_per_s"]:
        lines.append(f"limit: the pipeline, at {est['pipeline_agents_per_s']:,.0f} agents/s "
                     f"({fleet_text})")
    else:
        lines.append(f"limit: the GPUs ({fleet_text})")
    return "\n".join(lines)


def report_estimate(config: Any, ledger: Any, console: Any) -> dict | None:
    """After an emulated run: fetch the fleet's stats, store ``estimate`` in run.json and
    print it. Nothing for a run without emulated servers; a fleet that cannot be read is one
    warning line, never a failed run."""
    servers = config.cluster.servers
    if not servers.plugin.emulator or not config.agents.plugin.takes_endpoints:
        return None
    urls = config.agents.settings.endpoints
    stats, problems = fetch_stats(urls)
    for problem in problems[:3]:
        console.warn(f"estimate: {problem}")
    if not stats:
        console.warn("estimate: no emulated server answered /emulator/stats; no estimate")
        return None
    est = estimate(ledger.record, stats, servers.gpus_per_server, len(urls))
    ledger.set_estimate(est)
    for line in format_estimate(est).splitlines():
        console.line(line)
    return est
