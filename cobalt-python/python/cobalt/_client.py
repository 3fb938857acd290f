"""What the async and blocking clients share: credentials, request preparation, the
method shortcuts and the module-level functions' default client."""

from __future__ import annotations

import os
from typing import Any, Callable, Generic, Iterable, Optional, Tuple, TypeVar, Union

from . import _cobalt
from ._message import Code, METHODS, as_bytes

Payload = Union[str, bytes, bytearray, memoryview, None]
Pem = Union[str, "os.PathLike[str]", bytes]


def _pem(value: Optional[Pem]) -> Optional[bytes]:
    """PEM bytes as given, or read from a file path."""
    if value is None or isinstance(value, bytes):
        return value
    with open(value, "rb") as f:
        return f.read()


def native_client(
    psk: Optional[Tuple[Union[str, bytes], Union[str, bytes]]] = None,
    cert: Optional[Pem] = None,
    key: Optional[Pem] = None,
    ca: Optional[Pem] = None,
    server_name: Optional[str] = None,
) -> Any:
    """The native client with these credentials (see ``cobalt.Client``)."""
    identity, secret = (as_bytes(psk[0]), as_bytes(psk[1])) if psk is not None else (None, None)
    return _cobalt.Client(
        psk_identity=identity,
        psk_key=secret,
        cert_pem=_pem(cert),
        key_pem=_pem(key),
        ca_pem=_pem(ca),
        server_name=server_name,
    )


def method_code(method: Union[str, int]) -> int:
    """A method given by name (``"GET"``) or code."""
    if isinstance(method, str):
        try:
            return int(METHODS[method.upper()])
        except KeyError:
            raise ValueError(f"unknown method {method!r}: one of {', '.join(METHODS)}") from None
    return int(Code(method))


def prepare(
    native: Any,
    method: Union[str, int],
    uri: str,
    payload: Payload = None,
    *,
    content_format: Optional[int] = None,
    accept: Optional[int] = None,
    confirmable: bool = True,
    timeout: Optional[float] = None,
    block_size: Optional[int] = None,
    options: Iterable[Tuple[int, bytes]] = (),
) -> Any:
    """A native request ready to be sent or observed."""
    return native.prepare(
        method_code(method),
        uri,
        as_bytes(payload) if payload is not None else None,
        content_format,
        accept,
        confirmable,
        timeout,
        block_size,
        [(int(n), bytes(v)) for n, v in options],
    )


R = TypeVar("R")
"""What a request gives: a ``Response`` (blocking) or an awaitable of one (asyncio)."""


class Verbs(Generic[R]):
    """The method shortcuts of a client whose ``request`` gives ``R``."""

    request: Callable[..., R]
    """Sends a request: ``request(method, uri, payload=None, **options)``."""

    def get(self, uri: str, **kwargs: Any) -> R:
        """GET ``uri``."""
        return self.request("GET", uri, **kwargs)

    def post(self, uri: str, payload: Payload = None, **kwargs: Any) -> R:
        """POST ``payload`` to ``uri``."""
        return self.request("POST", uri, payload, **kwargs)

    def put(self, uri: str, payload: Payload = None, **kwargs: Any) -> R:
        """PUT ``payload`` at ``uri``."""
        return self.request("PUT", uri, payload, **kwargs)

    def delete(self, uri: str, **kwargs: Any) -> R:
        """DELETE ``uri``."""
        return self.request("DELETE", uri, **kwargs)

    def fetch(self, uri: str, payload: Payload = None, **kwargs: Any) -> R:
        """FETCH (RFC 8132) ``uri`` with ``payload`` as the query body."""
        return self.request("FETCH", uri, payload, **kwargs)

    def patch(self, uri: str, payload: Payload = None, **kwargs: Any) -> R:
        """PATCH (RFC 8132) ``uri``."""
        return self.request("PATCH", uri, payload, **kwargs)

    def ipatch(self, uri: str, payload: Payload = None, **kwargs: Any) -> R:
        """iPATCH (RFC 8132) ``uri``."""
        return self.request("IPATCH", uri, payload, **kwargs)


class ClientBase(Verbs[R]):
    """A client with its credentials (see ``cobalt.Client``), on a native client of its own."""

    def __init__(
        self,
        *,
        psk: Optional[Tuple[Union[str, bytes], Union[str, bytes]]] = None,
        cert: Optional[Pem] = None,
        key: Optional[Pem] = None,
        ca: Optional[Pem] = None,
        server_name: Optional[str] = None,
    ) -> None:
        self._native = native_client(psk, cert, key, ca, server_name)


O = TypeVar("O")
"""What observing gives: an async or a blocking ``Observation``."""


class DefaultClient(Verbs[R], Generic[R, O]):
    """The module-level functions (``cobalt.get``, ``cobalt.blocking.get``...): each
    call goes to a client without credentials, made on first use."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._client: Any = None

    def client(self) -> Any:
        """The client the module-level functions use (made on first use)."""
        if self._client is None:
            self._client = self._make()
        return self._client

    def reset(self) -> None:
        """Forgets the client (after ``cobalt.shutdown()``): the next call makes another."""
        self._client = None

    def request(self, method: Union[str, int], uri: str, payload: Payload = None, **kwargs: Any) -> R:
        """``Client.request`` on the default client."""
        result: R = self.client().request(method, uri, payload, **kwargs)
        return result

    def observe(self, uri: str, **kwargs: Any) -> O:
        """Observes ``uri`` with the default client."""
        observation: O = self.client().observe(uri, **kwargs)
        return observation
