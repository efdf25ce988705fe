"""Who may talk to the UI, and which paths a name in a URL may reach.

The model (docs/ui.md, "Security model"):

- Bound to a loopback address, the UI needs no token; a Host-header check refuses pages
  served under any other host name, so a web site cannot reach it by DNS rebinding.
- Bound to any other address it refuses to start without ``SIMPIPE_UI_TOKEN``; every request
  must then carry the token: an ``Authorization: Bearer`` / ``X-Simpipe-Token`` header, or the
  HttpOnly cookie that a first visit to ``/?token=...`` sets.
- Actions are POST-only and need the per-server CSRF token (delivered inside the page, sent
  back as ``X-CSRF-Token``); a cross-site form cannot set that header, and a cross-origin
  ``Origin`` is refused outright.
- A run or cluster name is one strict path segment (letters, digits, ``.``, ``_``, ``-``,
  starting with a letter or digit) and the resolved path must sit directly under its root;
  a file read or served inside it (``run.json``, the report) must resolve under the results
  root too, so a symlink cannot lead out of it.
- A URL from a state file becomes a link only if it is ``http``/``https``.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

TOKEN_ENV = "SIMPIPE_UI_TOKEN"
TOKEN_COOKIE = "simpipe_ui_token"
TOKEN_HEADER = "X-Simpipe-Token"
CSRF_HEADER = "X-CSRF-Token"
# Same alphabet as run.name and cluster names; never "." or ".." (must start alphanumeric).
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
CSRF = web.AppKey("csrf", str)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class UnsafeName(ValueError):
    """A name from a URL that is not one plain path segment under its root."""


class OutsideRoot(ValueError):
    """A path under the results root that resolves (through a symlink) outside it."""


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def safe_child(root: Path, name: str, suffix: str = "") -> Path:
    """``root/<name><suffix>`` if ``name`` is a plain name and the path stays under ``root``.

    The regex alone already excludes separators and dot segments; resolving as well refuses
    a symlink inside the root that points elsewhere.
    """
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise UnsafeName(f"invalid name {name!r}")
    base = root.resolve()
    path = (base / f"{name}{suffix}").resolve()
    if path.parent != base:
        raise UnsafeName(f"{name!r} leaves {base}")
    return path


def contained(root: Path, path: Path, root_name: str = "the results root") -> Path:
    """``path`` resolved, if it stays under ``root`` after following every symlink."""
    base = root.resolve()
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13)
        raise OutsideRoot(f"{path.name} cannot be resolved (a symlink loop)") from None
    if not resolved.is_relative_to(base):
        shown = path.relative_to(base) if path.is_relative_to(base) else path.name
        raise OutsideRoot(f"{shown} leads outside {root_name}")
    return resolved


def http_url(text: object) -> str | None:
    """``text`` if it is an absolute http(s) URL (safe in an ``href``), else None."""
    if not isinstance(text, str):
        return None
    try:
        parts = urlsplit(text.strip())
    except ValueError:
        return None
    return text.strip() if parts.scheme in ("http", "https") and parts.netloc else None


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


def _request_token(request: web.Request) -> str | None:
    scheme, _, credentials = request.headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer":  # auth schemes are case-insensitive (RFC 7235)
        return credentials.strip()
    return request.headers.get(TOKEN_HEADER) or request.cookies.get(TOKEN_COOKIE)


def make_auth_middleware(token: str | None, loopback_only: bool) -> Callable[..., Awaitable]:
    """Token, Host and CSRF checks for every request."""

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if loopback_only and not token:
            # Without a token only a loopback Host is trusted (DNS-rebinding defence).
            if not is_loopback(urlsplit("//" + (request.host or "")).hostname or ""):
                raise web.HTTPMisdirectedRequest(text="unexpected Host header\n")
        if token:
            given = request.query.get("token")
            if given is not None and request.method == "GET" and request.path == "/":
                if not _same(given, token):
                    raise web.HTTPUnauthorized(text="wrong token\n")
                # Move the token from the URL into a cookie so it leaves the address bar.
                response = web.HTTPSeeOther("/")
                response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="Strict",
                                    path="/")
                raise response
            if not _same(_request_token(request), token):
                raise web.HTTPUnauthorized(
                    text="this UI needs its token: open /?token=<SIMPIPE_UI_TOKEN> once, or "
                         "send the header X-Simpipe-Token\n")
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            check_csrf(request)
        return await handler(request)

    return auth


def check_csrf(request: web.Request) -> None:
    expected = request.app[CSRF]
    if not _same(request.headers.get(CSRF_HEADER), expected):
        raise web.HTTPForbidden(text="missing or wrong CSRF token\n")
    origin = request.headers.get("Origin")
    if origin and origin != "null":
        # An origin is scheme + host + port: https://h:p is another origin than http://h:p.
        parts = urlsplit(origin)
        if (parts.scheme.lower(), parts.netloc.lower()) != (request.scheme,
                                                            (request.host or "").lower()):
            raise web.HTTPForbidden(text="cross-origin request refused\n")
    if request.headers.get("Sec-Fetch-Site") not in (None, "same-origin", "none"):
        raise web.HTTPForbidden(text="cross-site request refused\n")


PAGE_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
# The report is a self-contained page (inline styles, data: images) and runs no script.
REPORT_CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
              "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")


@web.middleware
async def headers_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        response = exc
        _secure(response, request)
        raise
    _secure(response, request)
    return response


def _secure(response: web.StreamResponse, request: web.Request) -> None:
    if response.prepared:  # a stream (SSE) already sent its headers
        return
    response.headers.setdefault("Content-Security-Policy", PAGE_CSP)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "no-referrer"
    if request.path.startswith("/api/"):
        response.headers["Cache-Control"] = "no-store"
