"""What every HTTP request passes before a route sees it: who may call, from where, and how much.

``Guard`` is an ASGI middleware (it wraps the FastAPI app) that answers with OpenAI's error
body, in this order:

* **Host** (403): the ``Host`` header must name this server: the bind address, a loopback
  name when bound to loopback, or one of ``allowed_hosts``. This is the defence against DNS
  rebinding, where a web page's own domain is re-pointed at 127.0.0.1 so the browser
  treats the server as same-origin. Bound to every interface (``0.0.0.0``), any name passes.
* **Origin** (403): a browser sends ``Origin`` with every cross-site POST, even the
  ``text/plain`` "simple" ones it does not preflight. A request whose ``Origin`` is neither
  the server itself nor in ``allowed_origins`` is refused, so a page the operator opens
  cannot spend the server's compute. Allowed origins get CORS headers and preflight answers.
* **API key** (401): with ``api_key`` set, ``Authorization: Bearer <key>`` on every route
  but ``/health`` (load balancers probe it without credentials).
* **Body** (415, 413): a POST must say ``Content-Type: application/json`` and carry at most
  ``max_body_bytes``; the body is read here, so a route never holds an unbounded one.

Not in upstream mini-sglang; the checks are those of vLLM's ``--api-key`` and of Jupyter's
host and origin checks.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any, Awaitable, Callable, Dict, List, Sequence, Tuple
from urllib.parse import urlsplit

from .protocol import APIError

Scope = Dict[str, Any]
Receive = Callable[[], Awaitable[Dict[str, Any]]]
Send = Callable[[Dict[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
OPEN_PATHS = ("/health",)  # no key needed


def is_loopback(host: str) -> bool:
    """Whether the bind address ``host`` is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_host_names(bind: str, extra: Sequence[str]) -> List[str] | None:
    """The ``Host`` names this server answers to; None: any (bound to every interface)."""
    if "*" in extra or bind in ("0.0.0.0", "::", ""):
        return None
    names = [bind, *extra]
    if is_loopback(bind):
        names += LOOPBACK_NAMES
    return [n.lower() for n in names]


def _host_name(host_header: str) -> str:
    """``"[::1]:1919"`` -> ``"::1"``, ``"Example.com:80"`` -> ``"example.com"``."""
    return (urlsplit(f"//{host_header}").hostname or "").lower()


class Guard:
    """The ASGI middleware; see the module docstring for what it refuses."""

    def __init__(
        self,
        app: App,
        bind_host: str,
        api_key: str = "",
        allowed_origins: Sequence[str] = (),
        allowed_hosts: Sequence[str] = (),
        max_body_bytes: int = 4 << 20,
    ) -> None:
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes
        self.hosts = allowed_host_names(bind_host, allowed_hosts)
        self.origins = [o.rstrip("/").lower() for o in allowed_origins]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        method, path = scope["method"], scope["path"]
        try:
            host = headers.get("host", "")
            if self.hosts is not None and _host_name(host) not in self.hosts:
                raise APIError(
                    403,
                    f"Host '{host}' does not name this server (DNS rebinding?): allow it "
                    "with --allowed-hosts",
                    kind="permission_error",
                )
            origin = headers.get("origin")
            cors = self._check_origin(origin, host)
            if method == "OPTIONS" and cors:  # a preflight of an allowed origin
                return await self._reply(send, 204, b"", cors)
            if self.api_key and path not in OPEN_PATHS:
                given = headers.get("authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                    raise APIError(
                        401,
                        "missing or wrong API key: send 'Authorization: Bearer <key>'",
                        kind="authentication_error",
                        headers={"WWW-Authenticate": "Bearer"},
                    )
            if method == "POST":
                receive = await self._read_body(headers, receive)
        except APIError as e:
            return await e.response()(scope, receive, send)
        if not cors:
            return await self.app(scope, receive, send)

        async def send_with_cors(message: Dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    def _check_origin(self, origin: str | None, host: str) -> List[Tuple[bytes, bytes]]:
        """CORS headers to add (empty for same-origin or no ``Origin``).

        Raises:
            APIError: 403 for a cross-site origin not in ``allowed_origins``.
        """
        if origin is None:
            return []  # not a browser's cross-site request (curl, the openai client)
        o = origin.rstrip("/").lower()
        if urlsplit(o).netloc == host.lower() and o.startswith(("http://", "https://")):
            return []  # same origin: a page served by this very host
        if o in self.origins or "*" in self.origins:
            return [
                (b"access-control-allow-origin", origin.encode("latin-1")),
                (b"access-control-allow-headers", b"authorization, content-type"),
                (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                (b"vary", b"Origin"),
            ]
        raise APIError(
            403,
            f"cross-origin request from '{origin}' refused: allow it with --allowed-origins",
            kind="permission_error",
        )

    async def _read_body(self, headers: Dict[str, str], receive: Receive) -> Receive:
        """Read the whole body (at most ``max_body_bytes``); returns a ``receive`` that
        replays it, then passes on to the real one (the disconnect the routes watch for).

        Raises:
            APIError: 415 for a body that does not say it is JSON, 413 for one too long.
        """
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise APIError(
                415,
                f"the body must be JSON (Content-Type: application/json), got '{kind or 'none'}'",
            )
        too_long = APIError(
            413, f"the body is larger than {self.max_body_bytes} bytes (--max-body-bytes)"
        )
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            raise too_long
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return receive  # the client left: the route sees the disconnect
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                raise too_long
            more = message.get("more_body", False)
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replaying() -> Dict[str, Any]:
            return replay.pop() if replay else await receive()

        return replaying

    @staticmethod
    async def _reply(send: Send, status: int, body: bytes, headers: List) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
