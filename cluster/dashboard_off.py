"""A Dask scheduler preload for ``cluster.dashboard_address = ""``: no HTTP server at all.

A distributed Scheduler always starts an HTTP server, even with ``dashboard=False``: its
health, Prometheus, JSON and proxy routes stay up, on port 8787 by default. "Off" should
mean nothing listens, so simpipe starts that server on an ephemeral loopback port and this
preload closes it before the scheduler takes its first client, and drops the "dashboard"
service so no client is shown a link to it.

Passed as ``preload=["simpipe.cluster.dashboard_off"]``; distributed calls ``dask_setup``
in the scheduler's event loop when the scheduler starts.
"""

from __future__ import annotations

from typing import Any

PRELOAD = "simpipe.cluster.dashboard_off"
# Where the scheduler's HTTP server lives for the moment before this preload closes it.
PARKED_ADDRESS = "127.0.0.1:0"


def dask_setup(scheduler: Any) -> None:
    server = getattr(scheduler, "http_server", None)
    if server is not None:
        server.stop()
    scheduler.services.pop("dashboard", None)


def scheduler_options(dashboard_address: str) -> dict[str, Any]:
    """Scheduler keyword arguments for ``cluster.dashboard_address`` (``""``: off)."""
    if dashboard_address:
        return {"dashboard": True, "dashboard_address": dashboard_address}
    return {"dashboard": False, "dashboard_address": PARKED_ADDRESS, "preload": [PRELOAD]}
