"""Cobalt for Python: CoAP (RFC 7252) clients and servers for asyncio, with the protocol
in Rust (Cobalt's native core) and the handlers in Python.

    import cobalt

    response = await cobalt.get("coap://127.0.0.1/hello")
    async for n in cobalt.observe("coap+tcp://127.0.0.1/temp"):
        print(n.text)

    site = cobalt.Site()

    @site.route("/hello")
    async def hello(request):
        return "hello world"

    await site.serve(port=5683)

``cobalt.blocking`` has the client for scripts without an event loop.
"""

from __future__ import annotations

import atexit

from . import _cobalt, blocking
from ._bridge import forget_all as _forget_bridges
from ._errors import (
    BadUri,
    BlockTransferError,
    CoapError,
    ConnectionFailed,
    CredentialsError,
    HandshakeFailed,
    ObservationLost,
    Reset,
    ResponseError,
    Timeout,
    Unreachable,
    Unsupported,
)
from ._message import Code, ContentFormat, Option, Request, Response
from .client import Client, Observation, delete, fetch, get, ipatch, observe, patch, post, put, request
from .server import Resource, Server, Site

__all__ = [
    "BadUri", "BlockTransferError", "CoapError", "ConnectionFailed", "CredentialsError",
    "HandshakeFailed", "ObservationLost", "Reset", "ResponseError", "Timeout", "Unreachable",
    "Unsupported", "Code", "ContentFormat", "Option", "Request", "Response", "Client",
    "Observation", "delete", "fetch", "get", "ipatch", "observe", "patch", "post", "put",
    "request", "Resource", "Server", "Site", "blocking", "shutdown",
]


def shutdown() -> None:
    """Stops every server still running, then Cobalt's runtime, joining all their
    threads. Clients made before stop working; the next use starts a new runtime.
    Called at the interpreter's exit."""
    from . import client as _client_module
    from .server import shutdown_all

    shutdown_all()
    _client_module.reset_default_client()
    blocking.reset_default_client()
    _forget_bridges()
    _cobalt.shutdown()


atexit.register(shutdown)
