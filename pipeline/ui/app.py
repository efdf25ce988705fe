"""The aiohttp application: routes, JSON API, the live stream and the page.

Routes (every name in a URL is checked by ``security.safe_child``):

    GET  /                                the page (single-page app: #/runs, #/runs/<name>,
                                          #/clusters, #/actions)
    GET  /static/<file>                   its script and style sheet
    GET  /api/runs                        the runs list
    GET  /api/runs/<name>                 one run: progress, rounds, histogram, endpoints
    GET  /api/runs/<name>/events          the same as server-sent events, on every change
    GET  /api/runs/<name>/prompt?agent=N&round=R   the prompt agent N got in round R (from 1)
    GET  /runs/<name>/report              the run's report.html, when ``simpipe report`` made one
    POST /api/runs/<name>/cancel          ask a running run to stop (resumable)
    POST /api/runs/<name>/delete          {"confirm": "<name>"}: delete a run that is not running
    GET  /api/clusters                    clusters from ``simpipe cluster up``
    GET  /api/clusters/<name>             workers, servers, SLURM jobs
    POST /api/clusters/<name>/down        stop it and cancel all its jobs
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from simpipe.run.agent_prompt import PromptUnavailable, rebuild_prompt
from simpipe.ui import clusters, runs
from simpipe.ui.security import (
    CSRF,
    NAME_RE,
    REPORT_CSP,
    OutsideRoot,
    UnsafeName,
    headers_middleware,
    make_auth_middleware,
    new_secret,
)

EVENT_POLL_S = 0.2  # how often a live stream looks at the run's files (a few stat calls)
EVENT_KEEPALIVE_S = 5.0  # resend anyway: the state of a stale run changes with time alone
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}

RESULTS = web.AppKey("results", Path)
STOPPING = web.AppKey("stopping", asyncio.Event)
INDEX = web.AppKey("index", str)
STATIC = web.AppKey("static", dict)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda d: json.dumps(d, default=str))


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status=status)


async def _blocking(func: Callable, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, func, *args)


def _guarded(handler: Callable) -> Callable:
    """Map the domain errors to status codes, once for every route."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except UnsafeName:
            return _error(400, "invalid name: letters, digits, '.', '_', '-' only, starting "
                               "with a letter or digit; at most 128 characters (64 for a "
                               "cluster)")
        except OutsideRoot as exc:
            return _error(403, f"refused: {exc}")
        except (runs.RunNotFound, clusters.ClusterNotFound) as exc:
            return _error(404, f"not found: {exc}")
        except (runs.ActionRefused, clusters.ClusterBroken) as exc:
            return _error(409, str(exc))

    wrapped.__name__ = handler.__name__
    return wrapped


def _run_files(request: web.Request) -> runs.RunFiles:
    return runs.RunFiles.open(request.app[RESULTS], request.match_info["name"])


# --- page -----------------------------------------------------------------------------------

def _static_files() -> dict[str, bytes]:
    folder = resources.files("simpipe.ui") / "static"
    return {p.name: p.read_bytes() for p in folder.iterdir()
            if p.is_file() and NAME_RE.fullmatch(p.name)}


async def index(request: web.Request) -> web.Response:
    page = request.app[INDEX].replace("{{CSRF}}", request.app[CSRF])
    return web.Response(text=page, content_type="text/html", headers={"Cache-Control": "no-store"})


async def static(request: web.Request) -> web.Response:
    name = request.match_info["file"]
    body = request.app[STATIC].get(name)  # a fixed set, read at start: no path is ever built
    if body is None:
        return _error(404, "not found")
    ctype = STATIC_TYPES.get(Path(name).suffix, "application/octet-stream")
    return web.Response(body=body, content_type=ctype, headers={"Cache-Control": "no-cache"})


# --- runs -----------------------------------------------------------------------------------

@_guarded
async def runs_list(request: web.Request) -> web.Response:
    rows = await _blocking(runs.list_runs, request.app[RESULTS])
    return _json({"results": str(request.app[RESULTS]), "runs": rows})


@_guarded
async def run_get(request: web.Request) -> web.Response:
    files = _run_files(request)
    return _json(await _blocking(runs.run_detail, files))


@_guarded
async def run_events(request: web.Request) -> web.StreamResponse:
    """Push the run's detail whenever its files change: the page's update latency is the
    poll interval here plus one render, well under the 2 s goal."""
    files = _run_files(request)
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff"})
    await response.prepare(request)
    stopping = request.app[STOPPING]
    last_version, last_sent = None, 0.0
    try:
        while not stopping.is_set():
            current = runs.version(files)
            if current != last_version or time.monotonic() - last_sent > EVENT_KEEPALIVE_S:
                try:
                    detail = await _blocking(runs.run_detail, files)
                except runs.RunNotFound:
                    await response.write(b"event: gone\ndata: {}\n\n")
                    break
                payload = json.dumps(detail, default=str)
                await response.write(f"data: {payload}\n\n".encode())
                last_version, last_sent = current, time.monotonic()
            try:
                await asyncio.wait_for(stopping.wait(), EVENT_POLL_S)
            except TimeoutError:
                pass
    except (ConnectionResetError, ConnectionError):
        pass  # the page went away
    return response


@_guarded
async def run_report(request: web.Request) -> web.StreamResponse:
    files = _run_files(request)
    report = files.report()  # resolved: a symlink out of the results root is refused (403)
    if report is None:
        return _error(404, "no report yet: run `simpipe report` on this run")
    return web.FileResponse(report, headers={"Content-Security-Policy": REPORT_CSP,
                                             "Content-Type": "text/html"})


@_guarded
async def run_prompt(request: web.Request) -> web.Response:
    """The exact prompt of one agent and round, rebuilt from the run's files (every file
    read resolved inside the results root)."""
    files = _run_files(request)
    try:
        agent = int(request.query.get("agent", ""))
        round_number = int(request.query.get("round", "1"))
    except ValueError:
        return _error(400, "agent and round must be whole numbers: ?agent=0&round=1")
    try:
        shown = await _blocking(rebuild_prompt, files.root, agent, round_number - 1,
                                files.inside)
    except PromptUnavailable as exc:
        return _error(404, str(exc))
    return _json(shown.as_json())


@_guarded
async def run_cancel(request: web.Request) -> web.Response:
    files = _run_files(request)
    return _json(await _blocking(runs.cancel_run, files))


@_guarded
async def run_delete(request: web.Request) -> web.Response:
    files = _run_files(request)
    try:
        body = await request.json()
    except ValueError:
        body = {}
    confirm = body.get("confirm") if isinstance(body, dict) else None
    return _json(await _blocking(runs.delete_run, files, confirm))


# --- clusters -------------------------------------------------------------------------------

@_guarded
async def clusters_list(request: web.Request) -> web.Response:
    return _json({"clusters": await _blocking(clusters.list_clusters)})


@_guarded
async def cluster_get(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    clusters.state_file(name)  # validate before handing the name to a thread
    return _json(await _blocking(clusters.cluster_status, name))


@_guarded
async def cluster_down(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    clusters.state_file(name)
    return _json(await _blocking(clusters.cluster_down, name))


# --- the application ------------------------------------------------------------------------

async def _on_shutdown(app: web.Application) -> None:
    app[STOPPING].set()  # ends the live streams, so shutdown does not wait on them


def make_app(results_root: Path, token: str | None = None,
             loopback_only: bool = True) -> web.Application:
    """The UI over ``results_root``. ``token``: required on every request when set;
    ``loopback_only``: the server listens on a loopback address (Host header checked)."""
    app = web.Application(middlewares=[headers_middleware,
                                       make_auth_middleware(token, loopback_only)])
    app[RESULTS] = Path(results_root).resolve()
    app[STOPPING] = asyncio.Event()
    app[CSRF] = new_secret()
    app[INDEX] = (resources.files("simpipe.ui") / "index.html").read_text(encoding="utf-8")
    app[STATIC] = _static_files()
    app.on_shutdown.append(_on_shutdown)
    app.router.add_get("/", index)
    app.router.add_get("/static/{file}", static)
    app.router.add_get("/api/runs", runs_list)
    app.router.add_get("/api/runs/{name}", run_get)
    app.router.add_get("/api/runs/{name}/events", run_events)
    app.router.add_get("/api/runs/{name}/prompt", run_prompt)
    app.router.add_get("/runs/{name}/report", run_report)
    app.router.add_post("/api/runs/{name}/cancel", run_cancel)
    app.router.add_post("/api/runs/{name}/delete", run_delete)
    app.router.add_get("/api/clusters", clusters_list)
    app.router.add_get("/api/clusters/{name}", cluster_get)
    app.router.add_post("/api/clusters/{name}/down", cluster_down)
    return app
