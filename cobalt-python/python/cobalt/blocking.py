"""The blocking client, for scripts: ``cobalt.blocking.get(uri)``.

The same calls, arguments and exceptions as the asyncio client; each waits with the
GIL released (other Python threads run) and Ctrl-C interrupts it. Do not call these
from a running event loop: they would stop it while they wait.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional, Tuple, Union

from ._client import Payload, Pem, native_client, prepare
from ._errors import check as _check
from ._errors import from_native
from ._message import Response

__all__ = ["Client", "Observation", "get", "post", "put", "delete", "fetch", "request", "observe"]


def _outcome(value: Any, error: Any) -> Optional[Response]:
    if error is not None:
        raise from_native(error)
    return None if value is None else Response._from_native(value)


class Client:
    """A blocking CoAP client; its arguments are ``cobalt.Client``'s."""

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

    def get(self, uri: str, **kwargs: Any) -> Response:
        """GET ``uri``."""
        return self.request("GET", uri, **kwargs)

    def post(self, uri: str, payload: Payload = None, **kwargs: Any) -> Response:
        """POST ``payload`` to ``uri``."""
        return self.request("POST", uri, payload, **kwargs)

    def put(self, uri: str, payload: Payload = None, **kwargs: Any) -> Response:
        """PUT ``payload`` at ``uri``."""
        return self.request("PUT", uri, payload, **kwargs)

    def delete(self, uri: str, **kwargs: Any) -> Response:
        """DELETE ``uri``."""
        return self.request("DELETE", uri, **kwargs)

    def fetch(self, uri: str, payload: Payload = None, **kwargs: Any) -> Response:
        """FETCH ``uri`` with ``payload`` as the query body."""
        return self.request("FETCH", uri, payload, **kwargs)

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


_default: Optional[Client] = None


def default_client() -> Client:
    """The client the module-level functions use (made on first use)."""
    global _default
    if _default is None:
        _default = Client()
    return _default


def reset_default_client() -> None:
    """Forgets the module-level client (after ``cobalt.shutdown()``)."""
    global _default
    _default = None


def request(method: Union[str, int], uri: str, payload: Payload = None, **kwargs: Any) -> Response:
    """``Client.request`` on the default client."""
    return default_client().request(method, uri, payload, **kwargs)


def get(uri: str, **kwargs: Any) -> Response:
    """GET ``uri`` with the default client."""
    return default_client().request("GET", uri, **kwargs)


def post(uri: str, payload: Payload = None, **kwargs: Any) -> Response:
    """POST ``payload`` to ``uri`` with the default client."""
    return default_client().request("POST", uri, payload, **kwargs)


def put(uri: str, payload: Payload = None, **kwargs: Any) -> Response:
    """PUT ``payload`` at ``uri`` with the default client."""
    return default_client().request("PUT", uri, payload, **kwargs)


def delete(uri: str, **kwargs: Any) -> Response:
    """DELETE ``uri`` with the default client."""
    return default_client().request("DELETE", uri, **kwargs)


def fetch(uri: str, payload: Payload = None, **kwargs: Any) -> Response:
    """FETCH ``uri`` with the default client."""
    return default_client().request("FETCH", uri, payload, **kwargs)


def observe(uri: str, **kwargs: Any) -> Observation:
    """Observe ``uri`` with the default client: ``for n in cobalt.blocking.observe(uri)``."""
    return default_client().observe(uri, **kwargs)
