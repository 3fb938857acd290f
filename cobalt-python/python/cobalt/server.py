"""The asyncio server: resources are Python functions (or objects), the protocol is
Cobalt's.

    site = cobalt.Site()

    @site.route("/temp", observable=True, rt="temperature")
    async def temp(request):
        return "21.5"

    await site.serve(port=5683)

Cobalt's shard threads read the sockets, deduplicate, reassemble Block1 uploads, cut
Block2 answers, keep observe relations and answer discovery (``/.well-known/core``);
only the handlers run in Python, on the event loop that started the server.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from . import _bridge, _cobalt
from ._message import METHODS, Code, Request

__all__ = ["Site", "Resource", "Server"]

Handler = Callable[[Request], Any]

#: The servers running in this process, shut down by ``cobalt.shutdown()``.
_running: "set[Server]" = set()
_running_lock = threading.Lock()


class Resource:
    """One path: its handlers by method, its link attributes, its observers.

    Calling it calls its first handler; ``resource.post``, ``.put`` ... are decorators
    that add handlers for those methods. ``changed()`` notifies the observers of an
    observable resource with the GET handler's new answer.
    """

    def __init__(self, path: str, observable: bool, attrs: List[Tuple[str, Optional[str]]]) -> None:
        self.path = path
        self.handlers: Dict[Code, Handler] = {}
        self.attrs = attrs
        self._observable = _cobalt.Observable() if observable else None

    def __call__(self, request: Request) -> Any:
        return next(iter(self.handlers.values()))(request)

    def on(self, method: Union[str, int]) -> Callable[[Handler], Handler]:
        """A decorator adding the handler for ``method`` (``"PUT"``, ``Code.PUT``)."""
        code = _method(method)

        def add(handler: Handler) -> Handler:
            self.handlers[code] = handler
            return handler

        return add

    def get(self, handler: Handler) -> Handler:
        """Adds ``handler`` for GET."""
        return self.on("GET")(handler)

    def post(self, handler: Handler) -> Handler:
        """Adds ``handler`` for POST."""
        return self.on("POST")(handler)

    def put(self, handler: Handler) -> Handler:
        """Adds ``handler`` for PUT."""
        return self.on("PUT")(handler)

    def delete(self, handler: Handler) -> Handler:
        """Adds ``handler`` for DELETE."""
        return self.on("DELETE")(handler)

    def fetch(self, handler: Handler) -> Handler:
        """Adds ``handler`` for FETCH."""
        return self.on("FETCH")(handler)

    def changed(self, confirmable: bool = False) -> None:
        """The resource changed: every observer gets the GET handler's new answer
        (confirmable notifications if asked). Safe to call from any thread."""
        if self._observable is None:
            raise TypeError(f"{self.path} is not observable: route it with observable=True")
        if confirmable:
            self._observable.changed_confirmable()
        else:
            self._observable.changed()

    def deleted(self) -> None:
        """The resource is gone: every observer gets 4.04 and is removed."""
        if self._observable is not None:
            self._observable.deleted()

    @property
    def observer_count(self) -> int:
        """Observers registered now (0 for a resource that is not observable)."""
        return self._observable.observer_count() if self._observable is not None else 0

    def __repr__(self) -> str:
        methods = ", ".join(c.name for c in self.handlers)
        return f"<Resource {self.path} ({methods})>"


def _method(method: Union[str, int]) -> Code:
    if isinstance(method, str):
        try:
            return METHODS[method.upper()]
        except KeyError:
            raise ValueError(f"unknown method {method!r}: one of {', '.join(METHODS)}") from None
    code = Code(method)
    if code.code_class != 0 or code.detail == 0:
        raise ValueError(f"{code} is not a request method")
    return code


def _link_attrs(
    rt: Optional[str], interface: Optional[str], ct: Optional[int], title: Optional[str], attrs: Optional[Dict[str, Any]]
) -> List[Tuple[str, Optional[str]]]:
    out: List[Tuple[str, Optional[str]]] = []
    for name, value in (("rt", rt), ("if", interface), ("ct", ct), ("title", title)):
        if value is not None:
            out.append((name, str(value)))
    for name, value in (attrs or {}).items():
        out.append((name, None if value is True else str(value)))
    return out


class Site:
    """A set of resources, served by ``await site.serve(...)`` or ``site.start(...)``.

    A site can be served several times (each ``start`` is a server of its own); routes
    added later are served by servers started later.
    """

    def __init__(self) -> None:
        self.resources: Dict[str, Resource] = {}

    def route(
        self,
        path: str,
        methods: Iterable[Union[str, int]] = ("GET",),
        *,
        observable: bool = False,
        rt: Optional[str] = None,
        interface: Optional[str] = None,
        ct: Optional[int] = None,
        title: Optional[str] = None,
        attrs: Optional[Dict[str, Any]] = None,
    ) -> Callable[[Any], Resource]:
        """A decorator: the function (``async def`` or plain) handles ``methods`` at
        ``path``; the decorated name becomes the ``Resource`` (``.changed()``,
        ``.put`` ...). A class is instantiated and its ``get``/``post``/``put``/
        ``delete``/``fetch``/``patch``/``ipatch`` methods handle those methods.

        ``path`` may have parameters: ``/items/{id}`` (one segment), ``/files/{*rest}``
        (the rest), read with ``request.params``. ``rt``, ``interface`` (``if``),
        ``ct`` and ``title`` (and ``attrs``, ``True`` for a flag) describe the resource
        in ``/.well-known/core``; ``observable=True`` lets clients observe it (``obs``).
        """

        def add(target: Any) -> Resource:
            resource = self._resource(path, observable, _link_attrs(rt, interface, ct, title, attrs))
            if inspect.isclass(target):
                self._add_object(resource, target())
            else:
                for m in methods:
                    resource.on(m)(target)
            return resource

        return add

    def add(
        self,
        path: str,
        resource: Any,
        *,
        observable: bool = False,
        rt: Optional[str] = None,
        interface: Optional[str] = None,
        ct: Optional[int] = None,
        title: Optional[str] = None,
        attrs: Optional[Dict[str, Any]] = None,
    ) -> Resource:
        """Serves an object at ``path``: its ``get``, ``post``, ``put``, ``delete``,
        ``fetch``, ``patch`` and ``ipatch`` methods handle those methods."""
        r = self._resource(path, observable, _link_attrs(rt, interface, ct, title, attrs))
        self._add_object(r, resource)
        return r

    def _resource(self, path: str, observable: bool, attrs: List[Tuple[str, Optional[str]]]) -> Resource:
        if not path.startswith("/"):
            raise ValueError(f"a route's path starts with '/': {path!r}")
        if path in self.resources:
            raise ValueError(f"{path} is routed already: add methods with @resource.on(...)")
        r = self.resources[path] = Resource(path, observable, attrs)
        return r

    @staticmethod
    def _add_object(resource: Resource, obj: Any) -> None:
        found = False
        for name in METHODS:
            handler = getattr(obj, name.lower(), None)
            if callable(handler):
                resource.on(name)(handler)
                found = True
        if not found:
            raise TypeError(f"{type(obj).__name__} has none of the methods get, post, put, delete, fetch, patch, ipatch")

    async def start(
        self,
        host: Optional[str] = None,
        port: Optional[int] = None,
        *,
        config: Optional[Union[str, "os.PathLike[str]"]] = None,
        tcp: Union[int, bool, None] = None,
        dtls: Union[int, bool, None] = None,
        tls: Union[int, bool, None] = None,
        ws: Union[int, bool, None] = None,
        wss: Union[int, bool, None] = None,
        psk: Optional[Dict[Union[str, bytes], Union[str, bytes]]] = None,
        psk_file: Optional[Union[str, "os.PathLike[str]"]] = None,
        cert: Optional[Union[str, "os.PathLike[str]"]] = None,
        key: Optional[Union[str, "os.PathLike[str]"]] = None,
        ca: Optional[Union[str, "os.PathLike[str]"]] = None,
        shards: Optional[int] = None,
    ) -> "Server":
        """Starts serving and returns the running ``Server``.

        Settings are those of ``cobalt serve``: the defaults, then the ``config`` file
        (the same TOML file), then ``COBALT_<SECTION>_<KEY>`` variables, then ``host``,
        ``port`` (0: any free port) and ``shards``. UDP is always served; ``tcp``,
        ``dtls``, ``tls`` (coaps+tcp), ``ws`` and ``wss`` add a listener on that port
        (``True``: the standard one, 5683, 5684, 5684, 8080, 8443). The secure ones need
        ``psk`` (``{identity: key}``), ``psk_file`` (``cobalt serve --dtls-psk-file``'s
        format) or ``cert`` and ``key`` (PEM files; ``ca`` to verify client certificates).
        """
        loop = asyncio.get_running_loop()
        bridge = _bridge.bridge(loop)
        routes = []
        numbers = []
        for r in self.resources.values():
            handlers = []
            for code, handler in r.handlers.items():
                n = bridge.add_handler(handler)
                numbers.append(n)
                handlers.append((int(code), n))
            routes.append((r.path, handlers, r.attrs, r._observable))
        settings = [(k, str(v)) for k, v in (("server.bind", host), ("server.port", port), ("runtime.shards", shards)) if v is not None]
        listeners = []
        for scheme, value, standard in (
            ("coap+tcp", tcp, 5683), ("coaps", dtls, 5684), ("coaps+tcp", tls, 5684),
            ("coap+ws", ws, 8080), ("coaps+ws", wss, 8443),
        ):
            if value is True:
                listeners.append((scheme, standard))
            elif value is not None and value is not False:
                listeners.append((scheme, int(value)))
        pairs = [(_bytes(i), _bytes(k)) for i, k in (psk or {}).items()]
        try:
            native = _cobalt.start_server(
                routes, bridge.inbox, _path(config), settings, listeners, _path(psk_file), pairs,
                _path(cert), _path(key), _path(ca),
            )
        except BaseException:
            for n in numbers:
                bridge.handlers.pop(n, None)
            raise
        server = Server(native, bridge, numbers)
        with _running_lock:
            _running.add(server)
        return server

    async def serve(self, host: Optional[str] = None, port: Optional[int] = None, **kwargs: Any) -> None:
        """Starts serving (arguments as ``start``) until cancelled, then shuts down."""
        server = await self.start(host, port, **kwargs)
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.shield(server.shutdown())


def _path(p: Any) -> Optional[str]:
    return None if p is None else os.fspath(p)


def _bytes(v: Union[str, bytes]) -> bytes:
    return v.encode() if isinstance(v, str) else bytes(v)


class Server:
    """A running server: its addresses, and ``shutdown``."""

    def __init__(self, native: Any, bridge: "_bridge.Bridge", handler_numbers: List[int]) -> None:
        self._native = native
        self._bridge = bridge
        self._handler_numbers = handler_numbers
        #: The listeners: scheme to ``(host, port)``.
        self.addresses: Dict[str, Tuple[str, int]] = {}
        for scheme, addr in native.addresses():
            host, _, p = addr.rpartition(":")
            self.addresses.setdefault(scheme, (host.strip("[]"), int(p)))

    @property
    def port(self) -> int:
        """The UDP port."""
        return self.addresses["coap"][1]

    def uri(self, scheme: str = "coap", path: str = "") -> str:
        """A URI of this server for a client on this machine, e.g.
        ``server.uri("coap+tcp", "/temp")``; a wildcard address becomes loopback."""
        host, port = self.addresses[scheme]
        if host in ("::", "0.0.0.0"):
            host = "::1" if host == "::" else "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"{scheme}://{host}:{port}{path}"

    async def shutdown(self, grace: float = 1.0) -> None:
        """Stops serving: handlers in progress have ``grace`` seconds to answer (their
        loop keeps running meanwhile), then every thread of the server is joined."""
        token, future = self._bridge.expect()
        self._native.shutdown(self._bridge.inbox, token, grace)
        await future
        self._forget()

    def shutdown_blocking(self, grace: float = 0.0) -> None:
        """Stops serving and waits here (handlers on this thread's loop cannot run
        meanwhile; their requests get 5.03 after ``grace``)."""
        self._native.shutdown_blocking(grace)
        self._forget()

    def _forget(self) -> None:
        self._bridge.remove_handlers(set(self._handler_numbers))
        with _running_lock:
            _running.discard(self)

    async def __aenter__(self) -> "Server":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()


def shutdown_all() -> None:
    """Stops every running server at once (at exit, or ``cobalt.shutdown()``)."""
    with _running_lock:
        servers = list(_running)
    for s in servers:
        s.shutdown_blocking(0.0)
