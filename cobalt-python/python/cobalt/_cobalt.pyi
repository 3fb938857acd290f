"""Type stubs of the native core, ``cobalt._cobalt`` (see ``src/`` of the crate).

Values cross as plain Python: a response is ``(code, payload, [(number, value), ...])``,
an error ``(kind, message)`` where ``kind`` names a ``cobalt`` exception class.
"""

from os import PathLike
from typing import List, Optional, Sequence, Tuple, Union

NativeResponse = Tuple[int, bytes, List[Tuple[int, bytes]]]
NativeError = Tuple[str, str]
Event = Tuple[str, int, object, object]

class Inbox:
    """An event loop's inbox: readable ``fileno()`` when events wait; ``drain()`` takes them."""

    def __init__(self) -> None: ...
    def fileno(self) -> int: ...
    def drain(self) -> List[Event]: ...
    def close(self) -> None: ...

class Call:
    """A native call in progress."""

    def cancel(self) -> None: ...

class Prepared:
    """A request ready to be sent (once)."""

    def send(self, inbox: Inbox, token: int) -> Call: ...
    def observe(self, inbox: Inbox, token: int) -> Call: ...
    def send_blocking(self) -> Tuple[Optional[NativeResponse], Optional[NativeError]]: ...
    def observe_blocking(self) -> Tuple[Optional[Observation], Optional[NativeError]]: ...

class Client:
    """A native client with its credentials."""

    def __init__(
        self,
        *,
        psk_identity: Optional[bytes] = None,
        psk_key: Optional[bytes] = None,
        cert_pem: Optional[bytes] = None,
        key_pem: Optional[bytes] = None,
        ca_pem: Optional[bytes] = None,
        server_name: Optional[str] = None,
    ) -> None: ...
    def prepare(
        self,
        method: int,
        uri: str,
        payload: Optional[bytes] = None,
        content_format: Optional[int] = None,
        accept: Optional[int] = None,
        confirmable: bool = True,
        timeout: Optional[float] = None,
        block_size: Optional[int] = None,
        options: Sequence[Tuple[int, bytes]] = ...,
    ) -> Prepared: ...

class Observation:
    """A native observation."""

    def next(self, inbox: Inbox, token: int) -> Call: ...
    def next_blocking(self) -> Tuple[Optional[NativeResponse], Optional[NativeError]]: ...
    def cancel(self, inbox: Inbox, token: int) -> Call: ...
    def cancel_blocking(self) -> Tuple[Optional[NativeResponse], Optional[NativeError]]: ...
    def close(self) -> None: ...

class Request:
    """A request for a Python handler."""

    @property
    def method(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def query(self) -> List[str]: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def content_format(self) -> Optional[int]: ...
    @property
    def accept(self) -> Optional[int]: ...
    @property
    def peer(self) -> Tuple[str, int]: ...
    @property
    def scheme(self) -> str: ...
    @property
    def psk_identity(self) -> Optional[bytes]: ...
    @property
    def certificate_subject(self) -> Optional[str]: ...
    @property
    def params(self) -> dict: ...
    @property
    def options(self) -> List[Tuple[int, bytes]]: ...

class Responder:
    """Where a handler's answer goes (once)."""

    def send(self, code: int, payload: bytes, options: Sequence[Tuple[int, bytes]] = ...) -> bool: ...

class Observable:
    """An observable resource's handle."""

    def __init__(self) -> None: ...
    def changed(self) -> None: ...
    def changed_confirmable(self) -> None: ...
    def deleted(self) -> None: ...
    def observer_count(self) -> int: ...

class Server:
    """A running native server."""

    def addresses(self) -> List[Tuple[str, str]]: ...
    def shutdown(self, inbox: Inbox, token: int, grace: float) -> None: ...
    def shutdown_blocking(self, grace: float) -> None: ...

RouteSpec = Tuple[str, List[Tuple[int, int]], List[Tuple[str, Optional[str]]], Optional[Observable]]
StrPath = Union[str, PathLike]

def start_server(
    routes: Sequence[RouteSpec],
    inbox: Inbox,
    config: Optional[StrPath] = None,
    settings: Sequence[Tuple[str, str]] = ...,
    listeners: Sequence[Tuple[str, int]] = ...,
    psk_file: Optional[StrPath] = None,
    psk: Sequence[Tuple[bytes, bytes]] = ...,
    cert: Optional[StrPath] = None,
    key: Optional[StrPath] = None,
    ca: Optional[StrPath] = None,
) -> Server: ...
def shutdown() -> None: ...
def is_running() -> bool: ...
