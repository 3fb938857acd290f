"""The blocking client, for scripts: ``cobalt.blocking.get(uri)``.

The same calls, arguments and exceptions as the asyncio client; each waits with the
GIL released (other Python threads run) and Ctrl-C interrupts it. Do not call these
from a running event loop: they would stop it while they wait.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional, Tuple, Union

from ._client import ClientBase, DefaultClient, Payload, prepare
from ._errors import check as _check
from ._errors import from_native
from ._message import Response

__all__ = ["Client", "Observation", "get", "post", "put", "delete", "fetch", "patch", "ipatch", "request", "observe"]


def _outcome(value: Any, error: Any) -> Optional[Response]:
    if error is not None:
        raise from_native(error)
    return None if value is None else Response._from_native(value)


class Client(ClientBase[Response]):
    """A blocking CoAP client; its arguments are ``cobalt.Client``'s."""

    def request(
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
        """Sends a request and waits for the answer (see ``cobalt.Client.request``)."""
        prepared = prepare(
            self._native, method, uri, payload, content_format=content_format, accept=accept,
            confirmable=confirmable, timeout=timeout, block_size=block_size, options=options,
        )
        response = _outcome(*prepared.send_blocking())
        assert response is not None
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
        """Observes ``uri``: ``for n in client.observe(uri)``; registers at once."""
        prepared = prepare(self._native, "GET", uri, accept=accept, timeout=timeout, options=options)
        native, error = prepared.observe_blocking()
        if error is not None:
            raise from_native(error)
        return Observation(native, check)


class Observation:
    """An iterator of an observation's responses (the registration's answer first);
    a context manager that forgets the observation on exit."""

    def __init__(self, native: Any, check: bool) -> None:
        self._native = native
        self._check = check
        self._ended = False

    def __iter__(self) -> Iterator[Response]:
        return self

    def __next__(self) -> Response:
        if self._ended:
            raise StopIteration
        try:
            response = _outcome(*self._native.next_blocking())
        except BaseException:
            self._ended = True
            raise
        if response is None:
            self._ended = True
            raise StopIteration
        if response.code.is_error():
            self._ended = True
            if self._check:
                return _check(response)
        return response

    def cancel(self) -> Optional[Response]:
        """Deregisters (GET with Observe=1); the server's answer, or None if it had ended."""
        self._ended = True
        return _outcome(*self._native.cancel_blocking())

    def close(self) -> None:
        """Forgets the observation without asking the server."""
        self._ended = True
        self._native.close()

    def __enter__(self) -> "Observation":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_default: DefaultClient[Response, Observation] = DefaultClient(Client)
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
