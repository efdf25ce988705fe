"""An emulated fleet of GPU inference servers: TGI and OpenAI-compatible routes, answers timed
by a model of a GPU server's continuous batching (``emulator_model``) under a named profile
with published sources (``emulator_profiles``).

    python -m simpipe.servers.emulator --port 8300 --gpus 8 --profile a100-llama3-8b
        [--time-scale 10] [--protocol tgi|openai|both] [--model-id ID] [--host 0.0.0.0]
        [--max-batch 128 ...one flag per profile parameter] [--max-queued-mb 64]
        [--list-profiles]

One process serves ``--gpus`` independent emulated GPUs on consecutive ports from
``--port`` (``--port 0``: free ports), each with its own scheduler, queue and counters: the
routes of ``server_contract`` (``--protocol openai``: only the OpenAI routes and
``/health``, as vLLM serves), ``GET /health``, ``/info``, ``/v1/models``, ``/metrics``
(Prometheus: TGI's and vLLM's request counters) and ``GET /emulator/stats``: the GPU's
counters, busy fraction and a time series of ``(t_s, running, queued, busy_s, work_s,
completed)`` sampled every ``--sample-s`` (0.1 s) of real time, with its profile. Every
duration in answers and stats is modelled GPU time: ``--time-scale S`` runs the model S
times faster than the GPU would, and the figures are converted back.

Cost per request: one JSON parse, one answer, one queue entry and, when it finishes, one
encoded answer; no task per request, and one shared timer wakes the fleet at most every
``--tick-s`` (1 ms) to compute the steps that have ended and send what finished.
Prints ``simpipe-emulator listening on URL [URL ...]`` when every port listens, and serves
until SIGTERM or SIGINT.

Bounds, so that no request can freeze or bloat the process: the HTTP layer's (``http``:
head, URL and body sizes, bodies being received), the contract's (``contract``: the context,
regexes matched without backtracking), the profile's ``max_concurrent_requests`` (429), and
``--max-queued-mb``: the requests waiting in this process's queues hold at most that much
(their bodies and answers; 503 beyond). Settings are checked at start: a value that is not
finite or outside its range is one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Self

from simpipe.core import aio
from simpipe.servers import contract as contract
from simpipe.servers import synthetic_tokens
from simpipe.servers.emulator_model import GpuScheduler, Series, prefix_blocks
from simpipe.servers.emulator_profiles import (
    DEFAULT_PROFILE,
    MAX_GPUS_PER_PROCESS,
    PARAMETERS,
    PROFILES,
    TIME_SCALE_RANGE,
    GpuProfile,
    get_profile,
)
from simpipe.servers.http import BodyBudget, HttpRequest, HttpResponse, HttpServer
from simpipe.servers.process import ServerProcess

READY_LINE = "simpipe-emulator listening on"
VERSION = "simpipe-emulator-1"
SERIES_COLUMNS = ("t_s", "running", "queued", "busy_s", "work_s", "completed")
PROTOCOLS = ("tgi", "openai", "both")
SAMPLE_S_RANGE = (0.001, 3600.0)  # a stats sample every 0 s would spin a core
TICK_S_RANGE = (0.0, 1.0)
MAX_QUEUED_MB_RANGE = (1.0, 65_536.0)
#: Text prompts whose cache block keys are remembered (round 1's agents share a few texts).
TEXT_BLOCKS = 4096


def _in_range(option: str, value: float, bounds: tuple[float, float]) -> None:
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{option} {value!r}: expected a number from {low:g} to {high:g}")


@dataclass
class EmulatorOptions:
    profile: GpuProfile
    gpus: int = 1
    time_scale: float = 1.0
    protocol: str = "both"  # tgi: TGI's routes (it serves the OpenAI ones too); openai: vLLM's
    model_id: str = "simpipe/emulated"
    host: str = "127.0.0.1"
    port: int = 0  # the first GPU's; 0: a free port each
    sample_s: float = 0.1  # real seconds between time-series samples
    tick_s: float = 0.001  # real seconds: the fleet wakes at most this often
    max_queued_mb: float = 64.0  # what the waiting requests of all GPUs may hold together

    def __post_init__(self) -> None:
        """ValueError naming the option (as on the command line) and its range."""
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) \
                or not 1 <= self.gpus <= MAX_GPUS_PER_PROCESS:
            raise ValueError(f"--gpus {self.gpus!r}: expected an integer from 1 to "
                             f"{MAX_GPUS_PER_PROCESS} "
                             "(more GPUs: more emulator processes)")
        _in_range("--time-scale", self.time_scale, TIME_SCALE_RANGE)
        _in_range("--sample-s", self.sample_s, SAMPLE_S_RANGE)
        _in_range("--tick-s", self.tick_s, TICK_S_RANGE)
        _in_range("--max-queued-mb", self.max_queued_mb, MAX_QUEUED_MB_RANGE)
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}")
        if self.port and self.port + self.gpus - 1 > 65535:
            raise ValueError(f"ports {self.port}..{self.port + self.gpus - 1} pass 65535")


class _Gpu:
    """One emulated server: its port, scheduler, counters and series."""

    def __init__(self, index: int, profile: GpuProfile) -> None:
        self.index = index
        self.port = 0
        self.scheduler = GpuScheduler(profile)
        self.series = Series()
        self.invalid = 0  # requests refused by validation (4xx), never queued
        self.due_at = math.inf  # loop time of its next event
        self.http: HttpServer | None = None


class Emulator:
    """The fleet on this process's event loop: ``async with Emulator(opts) as fleet: ...``."""

    def __init__(self, options: EmulatorOptions) -> None:
        self.options = options
        self._gpus = [_Gpu(i, options.profile) for i in range(options.gpus)]
        self._scale = options.time_scale
        self._t0 = 0.0  # loop time of the modelled time origin
        self._started_unix = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._sampler: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._openai_only = options.protocol == "openai"
        self._bodies = BodyBudget()  # bodies being received, over every GPU's port
        self._queued_bytes = 0  # held by requests in the GPUs' queues (bodies, answers)
        self._max_queued_bytes = int(options.max_queued_mb * 2**20)
        self._text_blocks: dict[str, tuple[int, ...]] = {}  # prompt text -> block keys

    @property
    def urls(self) -> list[str]:
        return [f"http://{self.options.host}:{gpu.port}" for gpu in self._gpus]

    async def start(self) -> list[str]:
        self._loop = asyncio.get_running_loop()
        try:
            for gpu in self._gpus:
                port = self.options.port + gpu.index if self.options.port else 0
                gpu.http = HttpServer(self._handler(gpu), self.options.host, port, self._bodies)
                gpu.port = await gpu.http.start()
        except OSError:
            await self.stop()
            raise
        self._t0 = self._loop.time()
        self._started_unix = time.time()
        self._sampler = self._loop.call_later(self.options.sample_s, self._sample)
        return self.urls

    async def stop(self) -> None:
        for handle in (self._timer, self._sampler):
            if handle is not None:
                handle.cancel()
        self._timer = self._sampler = None
        for gpu in self._gpus:
            if gpu.http is not None:
                await gpu.http.stop()
                gpu.http = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- time ---------------------------------------------------------------------------------

    def _now(self) -> float:
        """Modelled seconds since start."""
        return (self._loop.time() - self._t0) * self._scale  # type: ignore[union-attr]

    def _due(self, gpu: _Gpu) -> float:
        event = gpu.scheduler.next_event_s()
        return math.inf if event is None else self._t0 + event / self._scale

    def _arm(self) -> None:
        """Keep one timer set for the earliest GPU event, at most one wake per tick."""
        due = min(gpu.due_at for gpu in self._gpus)
        if due == math.inf:
            return
        loop = self._loop
        when = max(due, loop.time() + self.options.tick_s)  # type: ignore[union-attr]
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer_at = when
        self._timer = loop.call_at(when, self._tick)  # type: ignore[union-attr]

    def _tick(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        now_loop = self._loop.time()  # type: ignore[union-attr]
        now = self._now()
        for gpu in self._gpus:
            if gpu.due_at <= now_loop:
                self._finish(gpu, now)
        self._arm()

    def _finish(self, gpu: _Gpu, now: float) -> None:
        """Compute ``gpu``'s steps up to ``now`` and answer every request that finished."""
        for done in gpu.scheduler.advance(now):
            fut, gen, cost = done.handle
            self._queued_bytes -= cost
            if fut.done():  # the client went away
                continue
            headers = {"x-queue-time": str(round((done.started_s - done.arrived_s) * 1000)),
                       "x-inference-time": str(round((done.finished_s - done.started_s) * 1000))}
            fut.set_result(contract.render(gen, headers))
        gpu.due_at = self._due(gpu)

    def _sample(self) -> None:
        now = self._now()
        for gpu in self._gpus:
            self._finish(gpu, now)
            s = gpu.scheduler
            gpu.series.add((round(now, 4), s.running, s.queued, round(s.busy_s, 4),
                            round(s.work_s, 4), s.completed))
        self._arm()
        self._sampler = self._loop.call_later(self.options.sample_s, self._sample)  # type: ignore[union-attr]

    # --- HTTP ---------------------------------------------------------------------------------

    def _handler(self, gpu: _Gpu) -> Any:
        gets = {
            "/health": lambda: HttpResponse(200),
            "/v1/models": lambda: contract.json_response(
                contract.models_list(self.options.model_id, "simpipe-emulator")),
            "/metrics": lambda: self._metrics(gpu),
            "/emulator/stats": lambda: contract.json_response(self.stats(gpu.index)),
        }
        if not self._openai_only:
            gets["/info"] = lambda: contract.json_response(contract.tgi_info(
                self.options.profile.max_concurrent_requests, self.options.model_id, VERSION,
                self.options.profile.context_tokens))

        def dispatch(request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
            if self._openai_only and request.path == "/tokenize" and request.method == "POST":
                # vLLM's tokenizer route: CPU work on the server, no GPU time
                try:
                    body = json.loads(request.body)
                except ValueError as exc:
                    return contract.error_response("openai", f"invalid JSON: {exc}")
                return contract.tokenize_response(body, self.options.profile.context_tokens)
            routed = contract.route(request, gets, self._openai_only)
            if isinstance(routed, HttpResponse):
                return routed
            kind, style, body = routed
            try:
                gen = contract.parse(kind, body, self.options.profile.context_tokens)
            except contract.Invalid as exc:
                gpu.invalid += 1
                return contract.error_response(style, str(exc), exc.param)
            if self._openai_only and body.get("model") != self.options.model_id:
                gpu.invalid += 1  # vLLM serves one model and knows its name
                return contract.error_response(
                    style, f"The model `{body.get('model')}` does not exist.", "model", 404)
            # What a waiting request holds: less than its body (only what the answer shows
            # is kept) and its answer.
            cost = len(request.body) + gen.tokens_out
            if self._queued_bytes + cost > self._max_queued_bytes:
                gpu.scheduler.rejected += 1
                return contract.queue_full(style, self._max_queued_bytes)
            fut = self._loop.create_future()  # type: ignore[union-attr]
            # n samples: one prefill, n sequences decoding; a probe (token ids with
            # logprobs, max_tokens 1) one decode step, whatever its top token's text; the
            # prompt's cache blocks for the prefix cache (emulator_model)
            probe = gen.prompt_ids is not None
            if not gpu.scheduler.submit(self._now(), (fut, gen, cost), gen.tokens_in,
                                        1 if probe else gen.longest_out, gen.samples,
                                        gen.samples if probe else gen.tokens_out,
                                        self._blocks(body, gen)):
                return contract.overloaded()
            self._queued_bytes += cost
            due = self._due(gpu)
            if due < gpu.due_at:
                gpu.due_at = due
                self._arm()
            return fut

        return dispatch

    def _blocks(self, body: dict, gen: contract.Generation) -> tuple[int, ...]:
        """The keys of the prompt's cache blocks (``emulator_model.prefix_blocks``) from its
        token ids as sent, or a text prompt's synthetic ids (``synthetic_tokens.prompt_ids``,
        remembered for the last ``TEXT_BLOCKS`` texts); () without prefix caching."""
        profile = self.options.profile
        if not profile.prefix_caching:
            return ()
        ids = body.get("prompt") if gen.kind == "completion" else None
        if isinstance(ids, list):  # token ids (the contract checked them)
            return prefix_blocks(ids, profile.block_size)
        keys = self._text_blocks.get(gen.prompt)
        if keys is None:
            if len(self._text_blocks) >= TEXT_BLOCKS:
                self._text_blocks.clear()
            keys = self._text_blocks[gen.prompt] = prefix_blocks(
                synthetic_tokens.prompt_ids(gen.prompt), profile.block_size)
        return keys

    def _metrics(self, gpu: _Gpu) -> HttpResponse:
        done = gpu.scheduler.completed
        text = (f"tgi_request_success {done}\n"
                f'vllm:request_success_total{{finished_reason="stop"}} {done}\n')
        return HttpResponse(200, text.encode(), None, "text/plain; version=0.0.4")

    # --- stats --------------------------------------------------------------------------------

    def stats(self, index: int) -> dict[str, Any]:
        """What ``GET /emulator/stats`` on GPU ``index``'s port answers (modelled seconds)."""
        gpu = self._gpus[index]
        now = self._now()
        self._finish(gpu, now)
        self._arm()
        counters = gpu.scheduler.counters()
        profile = self.options.profile
        return {
            "version": VERSION,
            "gpu": index,
            "gpus_in_process": len(self._gpus),
            "ports": [g.port for g in self._gpus],
            "protocol": self.options.protocol,
            "model_id": self.options.model_id,
            "time_scale": self._scale,
            "started_unix": self._started_unix,
            "now_s": now,
            **counters,
            "invalid": gpu.invalid,
            "busy_fraction": counters["busy_s"] / now if now > 0 else 0.0,
            # Real CPU seconds of this whole process (every GPU in it) so far: what serving
            # costs the machine, for benchmarks that share it with the pipeline.
            "process_cpu_s": time.process_time(),
            "profile": {**profile.as_dict(),
                        "saturated_s_per_token_out": profile.full_batch_request_s(0, 1)},
            "series_columns": list(SERIES_COLUMNS),
            "series_interval_s": self.options.sample_s * gpu.series.stride * self._scale,
            "series": gpu.series.rows,
        }


class EmulatorProcess(ServerProcess):
    """The emulator in a child process (benchmarks, tests, ``--emulate`` without SLURM):
    ``with EmulatorProcess(gpus=2, profile="fast") as emu: emu.urls``, one URL per GPU."""

    def __init__(self, *, gpus: int = 1, profile: str = "fast", time_scale: float = 1.0,
                 protocol: str = "both", port: int = 0, model_id: str | None = None,
                 params: dict[str, float] | None = None, start_timeout_s: float = 60.0,
                 max_queued_mb: float | None = None) -> None:
        command = [sys.executable, "-m", "simpipe.servers.emulator", "--gpus", str(gpus),
                   "--profile", profile, "--time-scale", repr(time_scale),
                   "--protocol", protocol, "--port", str(port)]
        if model_id:
            command += ["--model-id", model_id]
        if max_queued_mb is not None:
            command += ["--max-queued-mb", repr(max_queued_mb)]
        for name, value in (params or {}).items():
            command += [f"--{name.replace('_', '-')}", repr(value)]
        super().__init__(command, READY_LINE, name="emulator", start_timeout_s=start_timeout_s,
                         stop_timeout_s=10)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m simpipe.servers.emulator",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0,
                    help="the first GPU's port; GPU i listens on port + i (0: free ports)")
    ap.add_argument("--gpus", type=int, default=1, help="emulated GPUs (servers) in this process")
    ap.add_argument("--profile", default=DEFAULT_PROFILE, help=f"one of {', '.join(PROFILES)}")
    ap.add_argument("--time-scale", type=float, default=1.0,
                    help="run the model this many times faster than the GPU")
    ap.add_argument("--protocol", choices=PROTOCOLS, default="both")
    ap.add_argument("--model-id", default="simpipe/emulated",
                    help="the served model's name (/info, /v1/models; vLLM checks it)")
    ap.add_argument("--sample-s", type=float, default=0.1, help="real seconds per stats sample")
    ap.add_argument("--tick-s", type=float, default=0.001, help="real seconds per fleet wake-up")
    ap.add_argument("--max-queued-mb", type=float, default=64.0,
                    help="MiB the waiting requests of all GPUs may hold (503 beyond)")
    for name, meaning in PARAMETERS.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=float, default=None,
                        help=f"override the profile: {meaning}")
    ap.add_argument("--list-profiles", action="store_true", help="print the profiles and exit")
    return ap.parse_args(argv)


def _list_profiles() -> str:
    lines = []
    for p in PROFILES.values():
        params = ", ".join(f"{k}={v:.6g}" for k, v in p.parameters().items())
        lines.append(f"{p.name}: {p.gpu}, {p.model}\n  {params}\n  source: {p.source}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.list_profiles:
        print(_list_profiles())
        return 0
    overrides = {name: getattr(args, name) for name in PARAMETERS
                 if getattr(args, name) is not None}
    try:
        options = EmulatorOptions(get_profile(args.profile, overrides), args.gpus,
                                  args.time_scale, args.protocol, args.model_id, args.host,
                                  args.port, args.sample_s, args.tick_s, args.max_queued_mb)
    except ValueError as exc:
        print(f"simpipe-emulator: {exc}", file=sys.stderr)
        return 2

    async def serve() -> None:
        fleet = Emulator(options)
        try:
            urls = await fleet.start()
        except OSError as exc:
            print(f"simpipe-emulator: cannot listen on {options.host} from port "
                  f"{options.port} ({exc}); choose another --port", file=sys.stderr)
            raise SystemExit(1) from None
        print(f"{READY_LINE} {' '.join(urls)}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await fleet.stop()

    aio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
