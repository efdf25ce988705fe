"""Which inference endpoints are on this node (``is_local``).

Why it matters: on a GPU cluster a request to the server on the same node skips the network
hop and keeps the load of each node's workers on that node's GPUs. The preference itself
lives in the endpoint pool (``simpipe.inference.http.backend.EndpointPool``): it sends each request
to the least-loaded of this node's servers that has a free slot, and to the other nodes'
servers only when every local one is down or saturated.

On one machine every server is on this node. ``emulate_node`` tells a process which servers
are its node's instead, so one machine can stand for several nodes (``simpipe bench fleet``:
each emulated node is a server job and its own worker jobs).
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Sequence
from urllib.parse import urlsplit


@functools.lru_cache(maxsize=1)
def local_names() -> frozenset[str]:
    """Host names and addresses that mean "this node"."""
    names = {"localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()}
    try:
        host, aliases, addrs = socket.gethostbyname_ex(socket.gethostname())
        names.update([host, *aliases, *addrs])
    except OSError:
        pass  # an unresolvable hostname: interface addresses below still count
    try:
        import psutil  # a declared dependency, only needed here

        for addrs in psutil.net_if_addrs().values():
            names.update(a.address.split("%")[0] for a in addrs
                         if a.family in (socket.AF_INET, socket.AF_INET6))
    except (ImportError, OSError):
        pass
    names.add(socket.gethostname().split(".")[0])
    return frozenset(n.lower() for n in names if n)


_node_endpoints: frozenset[str] | None = None


def emulate_node(endpoints: Sequence[str] | None) -> None:
    """From now on, ``endpoints`` are this process's node's servers and no others are
    (None: back to the host names). Set it before the back-end is first used: the endpoint
    pool reads it once."""
    global _node_endpoints
    _node_endpoints = None if endpoints is None else frozenset(e.rstrip("/") for e in endpoints)


def is_local(url: str, names: frozenset[str] | None = None) -> bool:
    """Whether ``url``'s server is on this node: its host is one of ``names`` (default
    ``local_names()``) or a loopback address; under ``emulate_node``, whether it is one of
    that node's endpoints."""
    if _node_endpoints is not None and names is None:
        return url.rstrip("/") in _node_endpoints
    host = (urlsplit(url).hostname or "").lower()
    names = names if names is not None else local_names()
    if host in names or host.split(".")[0] in names:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
