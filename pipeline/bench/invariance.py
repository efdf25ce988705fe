"""``simpipe bench invariance``: which of llama.cpp's numbers survive batching.

The reproducible path (``LlamaCppBackend._serial_calls``, ``logprob_session``) runs every
call alone in one slot because llama.cpp's results depend on what shares a decode step.
This benchmark measures, with the embedded engine (xllamacpp in-process) and the default
model, which conditions leave a prompt's next-token log-probabilities (top 20) and its
sampled text at a fixed seed bit-identical, and what each way of calling costs:

* invariance table: per engine set-up (threads, n_parallel, kv_unified, flash attention,
  n_ubatch), the lone reference (slot 0, decoded afresh) against a repeat, another slot, a
  cached prefix cut elsewhere, and batches of 2..32 sequences decoded together (identical
  prompts; distinct prompts of different lengths), each batch run twice (run-to-run);
* sampled texts: round-3 requests (max_tokens 6, per-agent seeds, the answer grammar) lone
  vs batched, and batched twice;
* throughput: distinct round-3 prompts, sorted (neighbours share long prefixes), through the
  lone serial path and batched modes, interleaved A, B, A, B so that background load hits
  all of them; and 1 process x 2 threads vs 2 processes x 1 thread for the lone path.

Round-3 prompts: the paper's population (education x gender) with two earlier rounds of
distinct own guesses, as the pipeline renders them.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simpipe.agents.llm import prompting, requests_for
from simpipe.config.model import config_from_dict
from simpipe.core.tables import markdown_table
from simpipe.games.beauty_contest.prompts import HistoryItem
from simpipe.games.registry import game_for
from simpipe.inference.base import GenerationRequest
from simpipe.inference.llamacpp.completions import request_body
from simpipe.inference.llamacpp.engine_setup import build_has_llguidance, build_params, open_engine
from simpipe.inference.llamacpp.model_files import engine_model_path

TOP_N = 20
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
EDUCATION = ("Elementary School", "High School", "Bachelor's Degree", "Master's Degree",
             "Ph.D.")
GENDERS = ("male", "female")
FORMATS = {"max_abs_diff": "{:.2g}", "prompts_per_s": "{:.2f}", "ratio_to_lone": "{:.2f}",
           "wall_s": "{:.1f}"}

Top = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Setup:
    """One engine configuration (build_params' defaults, then these knobs)."""

    threads: int = 2
    n_parallel: int = 32
    kv_unified: bool = True
    swa_full: bool = True
    flash_attn: str = "auto"
    n_ubatch: int = 0  # 0: llama.cpp's default (512)

    def label(self) -> str:
        parts = [f"t{self.threads}", f"np{self.n_parallel}",
                 "unified" if self.kv_unified else "per-slot KV"]
        if not self.swa_full:
            parts.append("no swa_full")
        if self.flash_attn != "auto":
            parts.append(f"FA {self.flash_attn}")
        if self.n_ubatch:
            parts.append(f"ubatch {self.n_ubatch}")
        return ", ".join(parts)


def open_setup(setup: Setup, model_path: Path | None = None) -> Any:
    params = build_params(model_path or engine_model_path(), n_parallel=setup.n_parallel,
                          n_ctx=0, threads=setup.threads)
    params.kv_unified = setup.kv_unified
    params.swa_full = setup.swa_full
    params.flash_attn_type = FLASH_ATTN[setup.flash_attn]
    if setup.n_ubatch:
        params.n_ubatch = setup.n_ubatch
        params.n_batch = max(setup.n_ubatch, params.n_batch)
    return open_engine(params)


def round3_prompts(n: int, seed: int = 7) -> list[str]:
    """``n`` distinct round-3 prompts (two earlier rounds), sorted as the pipeline sorts
    distinct prompts: neighbours share the rules, the persona and often round 1."""
    builder, _ = prompting(game_for(config_from_dict({}).game), "completion")
    rng = np.random.default_rng(seed)
    prompts: set[str] = set()
    while len(prompts) < n:
        i = len(prompts)
        persona = (f"You are a {GENDERS[i % 2]} person. "
                   f"Your highest education is: {EDUCATION[(i // 2) % len(EDUCATION)]}.")
        g1, g2 = (float(x) for x in rng.integers(0, 101, 2))
        history = [HistoryItem(0, g1, 33.3), HistoryItem(1, g2, 24.7)]
        prompts.add(builder.render(persona, history, 2))
    return sorted(prompts)


def round3_requests(n: int) -> list[GenerationRequest]:
    cfg = config_from_dict({"agents": {"backend": "llamacpp", "max_tokens": 6}})
    seeds = np.arange(1000, 1000 + n)
    return requests_for(round3_prompts(n), seeds, game_for(cfg.game), cfg.agents)


def top_logprobs(server: Any, prompt: Any, *, slot: int = 0, cache: bool = False) -> Top:
    r = server.handle_completions({"prompt": prompt, "max_tokens": 1, "n_probs": TOP_N,
                                   "temperature": 1.0, "top_k": 1, "seed": 0,
                                   "cache_prompt": cache, "id_slot": slot})
    entries = r["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    return tuple((int(e["id"]), float(e["logprob"])) for e in entries)


def together(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run the calls from as many threads, released at once (one batch in llama.cpp)."""
    out: list[Any] = [None] * len(calls)
    barrier = threading.Barrier(len(calls))

    def run(i: int) -> None:
        barrier.wait()
        out[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def compare(refs: Sequence[Top], got: Sequence[Top]) -> tuple[int, float]:
    """(how many of ``got`` equal their reference bit for bit, max |logprob difference|
    over tokens in both)."""
    same, worst = 0, 0.0
    for ref, g in zip(refs, got, strict=True):
        same += ref == g
        a, b = dict(ref), dict(g)
        diffs = [abs(a[k] - b[k]) for k in a.keys() & b.keys()]
        worst = max(worst, *diffs) if diffs else worst
    return same, worst


def _row(setup: Setup, condition: str, against: str, refs: Sequence[Top],
         got: Sequence[Top]) -> dict:
    same, worst = compare(refs, got)
    return {"setup": setup.label(), "condition": condition, "against": against,
            "identical": f"{same}/{len(got)}", "max_abs_diff": worst}


def invariance_rows(setup: Setup, prompts: Sequence[str], widths: Sequence[int],
                    default_refs: Sequence[Top] | None) -> tuple[list[dict], list[Top]]:
    """The invariance table's rows for one set-up, and its lone references."""
    server = open_setup(setup)
    k = len(prompts)
    lone = lambda p, **kw: top_logprobs(server, p, **kw)  # noqa: E731
    refs = [lone(p) for p in prompts]
    rows = []
    if default_refs is not None:
        rows.append(_row(setup, "lone, slot 0, fresh", "default set-up's lone", default_refs,
                         refs))
    rows.append(_row(setup, "lone, slot 0, fresh, again", "lone ref", refs,
                     [lone(p) for p in prompts]))
    slot = min(3, setup.n_parallel - 1)
    if slot:
        rows.append(_row(setup, f"lone, slot {slot}, fresh", "lone ref", refs,
                         [lone(p, slot=slot) for p in prompts]))
    cut = []
    for p in prompts:  # cache a prefix that ends mid-prompt, then the whole prompt
        lone(p[: len(p) * 2 // 3], slot=0)
        cut.append(lone(p, slot=0, cache=True))
    rows.append(_row(setup, "lone, slot 0, cached prefix cut at 2/3", "lone ref", refs, cut))
    for w in widths:
        if w > setup.n_parallel:
            continue
        for kind in ("identical", "distinct"):
            batch = ([prompts[0]] * w if kind == "identical"
                     else [prompts[i % k] for i in range(w)])
            want = [refs[0]] * w if kind == "identical" else [refs[i % k] for i in range(w)]
            runs = [together([lambda p=p, s=s: lone(p, slot=s) for s, p in enumerate(batch)])
                    for _ in range(2)]
            rows.append(_row(setup, f"batch of {w}, {kind} prompts, fresh", "lone ref",
                             want, runs[0]))
            rows.append(_row(setup, f"batch of {w}, {kind} prompts, fresh", "same batch, run 1",
                             runs[0], runs[1]))
    return rows, refs


def sampled_rows(setup: Setup, requests: Sequence[GenerationRequest], width: int) -> list[dict]:
    """Sampled texts at fixed seeds: lone serial (the project's reproducible path) vs
    batched ``width`` at a time (prompt cache on, any slot), and batched twice."""
    server = open_setup(setup)
    llg = build_has_llguidance()

    def lone_serial() -> list[str]:
        out = []
        for i, req in enumerate(requests):
            _, body = request_body(req, cache_prompt=i > 0, llguidance=llg)
            body["id_slot"] = 0
            out.append(server.handle_completions(body)["choices"][0]["text"])
        return out

    def batched() -> list[str]:
        out: list[str] = []
        for start in range(0, len(requests), width):
            bodies = [request_body(r, cache_prompt=True, llguidance=llg)[1]
                      for r in requests[start:start + width]]
            out += [r["choices"][0]["text"] for r in
                    together([lambda b=b: server.handle_completions(b) for b in bodies])]
        return out

    a, b, c = lone_serial(), batched(), batched()
    n = len(requests)

    def row(condition: str, against: str, x: list[str], y: list[str]) -> dict:
        return {"setup": setup.label(), "condition": condition, "against": against,
                "identical": f"{sum(p == q for p, q in zip(x, y, strict=True))}/{n}",
                "max_abs_diff": None}

    rows = [row(f"sampled texts, batches of {width}", "lone serial", a, b),
            row(f"sampled texts, batches of {width}", "same batches, run 1", b, c),
            row("sampled texts, lone serial, again", "lone serial", a, lone_serial())]
    return rows


# --- throughput -------------------------------------------------------------------------

def _lone_serial(server: Any, bodies: Sequence[dict]) -> None:
    for i, body in enumerate(bodies):
        server.handle_completions({**body, "cache_prompt": i > 0, "id_slot": 0})


def _batched(server: Any, bodies: Sequence[dict], width: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(width) as pool:
        list(pool.map(server.handle_completions, bodies))


def _bodies(n: int) -> list[dict]:
    llg = build_has_llguidance()
    return [request_body(r, cache_prompt=True, llguidance=llg)[1] for r in round3_requests(n)]


def _process_lone(args: tuple[list[dict], int, Any]) -> None:
    bodies, threads, start = args
    server = open_setup(Setup(threads=threads, n_parallel=1))
    _lone_serial(server, bodies[:1])  # warm-up (allocations), not timed
    start.wait()
    _lone_serial(server, bodies)


def two_processes(bodies: list[dict]) -> float:
    """Wall time of 2 processes x 1 thread, each the lone path over half the prompts
    (contiguous halves: each keeps its neighbours' shared prefixes)."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(3)
    half = len(bodies) // 2
    procs = [ctx.Process(target=_process_lone, args=((part, 1, start),))
             for part in (bodies[:half], bodies[half:])]
    for p in procs:
        p.start()
    start.wait()
    t0 = time.perf_counter()
    for p in procs:
        p.join()
    return time.perf_counter() - t0


def throughput_rows(n: int, width: int, repeats: int,
                    echo: Callable[[str], None] | None = None) -> list[dict]:
    """Prompts/s of each mode on the same ``n`` sorted round-3 requests, interleaved;
    ``echo`` gets each timed run as it ends."""
    bodies = _bodies(n)
    modes: dict[str, tuple[Setup, Callable[[Any], None]]] = {
        "lone serial, slot 0 (reproducible default)":
            (Setup(n_parallel=width), lambda s: _lone_serial(s, bodies)),
        f"batched, {width} threads, unified KV (default batched)":
            (Setup(n_parallel=width), lambda s: _batched(s, bodies, width)),
        "lone serial, 1 thread":
            (Setup(threads=1, n_parallel=1), lambda s: _lone_serial(s, bodies)),
    }
    servers = {name: open_setup(setup) for name, (setup, _) in modes.items()}
    for name in modes:  # warm-up: first allocations, not timed
        _lone_serial(servers[name], bodies[:2])
    times: dict[str, list[float]] = {name: [] for name in [*modes, "2 processes x 1 thread"]}
    for _ in range(repeats):
        for name, (_, fn) in modes.items():
            t0 = time.perf_counter()
            fn(servers[name])
            times[name].append(time.perf_counter() - t0)
            if echo:
                echo(f"# {name}: {times[name][-1]:.1f} s")
        times["2 processes x 1 thread"].append(two_processes(bodies))
        if echo:
            echo(f"# 2 processes x 1 thread: {times['2 processes x 1 thread'][-1]:.1f} s")
    lone = n / float(np.median(times[next(iter(modes))]))
    rows = []
    for name, ts in times.items():
        wall = float(np.median(ts))
        rows.append({"mode": name, "prompts": n, "wall_s": wall, "prompts_per_s": n / wall,
                     "ratio_to_lone": n / wall / lone, "runs": len(ts)})
    return rows


SETUPS = (
    Setup(),
    Setup(threads=1),
    Setup(n_parallel=8),
    Setup(kv_unified=False),
    Setup(flash_attn="off"),
    Setup(flash_attn="on"),
    Setup(n_ubatch=8),
    Setup(threads=1, kv_unified=False, flash_attn="off"),
)


def run_invariance(probe_prompts: int = 4, widths: Sequence[int] = (2, 4, 8, 32),
                   sample_requests: int = 16, throughput_prompts: int = 48,
                   repeats: int = 2, setups: Sequence[Setup] = SETUPS,
                   echo: Callable[[str], None] | None = None) -> None:
    """Print the three tables (each set-up's rows as soon as they are measured)."""
    echo = echo or functools.partial(print, flush=True)
    echo(f"# load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    prompts = round3_prompts(max(probe_prompts, 2))[:probe_prompts]
    rows: list[dict] = []
    default_refs = None
    for setup in setups:
        got, refs = invariance_rows(setup, prompts, widths, default_refs)
        default_refs = default_refs or refs
        rows += got
        echo(markdown_table(got, FORMATS))
    echo("\n## Top-20 log-probabilities\n")
    echo(markdown_table(rows, FORMATS))
    sampled = []
    for setup in (Setup(), Setup(kv_unified=False), Setup(threads=1, kv_unified=False,
                                                          flash_attn="off")):
        got = sampled_rows(setup, round3_requests(sample_requests), 8)
        sampled += got
        echo(markdown_table(got, FORMATS))
    echo("\n## Sampled texts (max_tokens 6, fixed seeds)\n")
    echo(markdown_table(sampled, FORMATS))
    if throughput_prompts:
        echo("\n## Throughput, distinct sorted round-3 prompts\n")
        echo(markdown_table(throughput_rows(throughput_prompts, 8, repeats, echo), FORMATS))
    echo(f"# load average at end: {os.getloadavg()[0]:.1f}")


