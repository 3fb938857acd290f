"""The asyncio client: ``await cobalt.get(uri)``, ``async for n in cobalt.observe(uri)``.

Every scheme of Cobalt's client: ``coap``, ``coaps`` (DTLS with a pre-shared key or
certificates), ``coap+tcp``, ``coaps+tcp``, ``coap+ws`` and ``coaps+ws``; block-wise
transfers happen underneath. The protocol runs on Cobalt's threads; the event loop only
wakes when an answer is there.

A 4.xx or 5.xx answer raises ``ResponseError`` (with ``.code`` and ``.response``)
unless ``check=False``: a script that forgets to look at the code would otherwise take
"4.04 Not Found" for the resource's content. aiocoap returns such answers; pass
``check=False`` for that behaviour.
"""

from __future__ import annotations

from typing import Any, Awaitable, Iterable, Optional, Tuple, Union

from . import _bridge
from ._client import ClientBase, DefaultClient, Payload, prepare
from ._errors import check as _check
from ._errors import from_native
from ._message import Response

__all__ = ["Client", "Observation", "get", "post", "put", "delete", "fetch", "patch", "ipatch", "request", "observe"]


class Client(ClientBase[Awaitable[Response]]):
    """A CoAP client for every scheme, with its credentials for the secure ones.

    ``psk=(identity, key)`` for ``coaps://`` with a pre-shared key; ``ca`` (and ``cert``
    and ``key`` to present a certificate, ``server_name`` to check in the server's)
    for certificates, as PEM bytes or file paths. Without credentials a TLS server is
    verified against the system's CAs. Clients share nothing with each other; one
    client keeps its connections (TCP, WebSockets, DTLS sessions) for all its requests.
    """

    async def request(
        self,
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
        check: bool = True,
    ) -> Response:
        """Sends a request and returns the answer (the whole body, however many blocks).

        ``timeout`` (seconds) bounds the whole call (``Timeout``); without it the
        retransmission rules do (about 93 s over UDP). Raises ``ResponseError`` for a
        4.xx or 5.xx answer unless ``check=False``.
        """
        prepared = prepare(
            self._native, method, uri, payload, content_format=content_format, accept=accept,
            confirmable=confirmable, timeout=timeout, block_size=block_size, options=options,
        )
        b = _bridge.bridge()
        token, future = b.expect()
        value, error = await _bridge.wait(token, future, prepared.send(b.inbox, token))
        if error is not None:
            raise from_native(error)
        response = Response._from_native(value)
        return _check(response) if check else response

    def observe(
        self,
        uri: str,
        *,
        accept: Optional[int] = None,
        timeout: Optional[float] = None,
        options: Iterable[Tuple[int, bytes]] = (),
        check: bool = True,
    ) -> "Observation":
        """Observes ``uri`` (RFC 7641): ``async for n in client.observe(uri)``.

        The first item is the registration's answer, then each notification.
        ``timeout`` bounds the registration.
        """
        prepared = prepare(self._native, "GET", uri, accept=accept, timeout=timeout, options=options)
        return Observation(prepared, check)


class Observation:
    """An observation: an async iterator of responses, and an async context manager
    that ends the relation on exit.

    It registers on first iteration (or ``await obs.start()``); ``await obs.cancel()``
    deregisters (GET with Observe=1) and returns the server's answer; ``close()``
    forgets it (over UDP the next notification is answered with RST).
    """

    def __init__(self, prepared: Any, check: bool) -> None:
        self._prepared = prepared
        self._check = check
        self._native: Any = None
        self._ended = False

    async def start(self) -> "Observation":
        """Registers, if not done yet."""
        if self._native is None and self._prepared is not None:
            prepared, self._prepared = self._prepared, None
            b = _bridge.bridge()
            token, future = b.expect()
            value, error = await _bridge.wait(token, future, prepared.observe(b.inbox, token))
            if error is not None:
                self._ended = True
                raise from_native(error)
            self._native = value
        return self

    def __aiter__(self) -> "Observation":
        return self

    async def __anext__(self) -> Response:
        await self.start()
        if self._ended or self._native is None:
            raise StopAsyncIteration
        b = _bridge.bridge()
        token, future = b.expect()
        value, error = await _bridge.wait(token, future, self._native.next(b.inbox, token))
        if error is not None:
            self._ended = True
            raise from_native(error)
        if value is None:
            self._ended = True
            raise StopAsyncIteration
        response = Response._from_native(value)
        if response.code.is_error():
            # The server ended the relation with an error (4.04 when the resource went).
            self._ended = True
            if self._check:
                return _check(response)
        return response

    async def cancel(self) -> Optional[Response]:
        """Deregisters (GET with Observe=1); the server's answer, or None if the
        observation had ended."""
        self._ended = True
        if self._native is None:
            self._prepared = None
            return None
        b = _bridge.bridge()
        token, future = b.expect()
        value, error = await _bridge.wait(token, future, self._native.cancel(b.inbox, token))
        if error is not None:
            raise from_native(error)
        return None if value is None else Response._from_native(value)

    def close(self) -> None:
        """Forgets the observation without asking the server."""
        self._ended = True
        self._prepared = None
        if self._native is not None:
            self._native.close()

    async def __aenter__(self) -> "Observation":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


_default: DefaultClient[Awaitable[Response], Observation] = DefaultClient(Client)
default_client = _default.client
reset_default_client = _default.reset
request = _default.request
get = _default.get
post = _default.post
put = _default.put
delete = _default.delete
fetch = _default.fetch
patch = _default.patch
ipatch = _default.ipatch
observe = _default.observe
