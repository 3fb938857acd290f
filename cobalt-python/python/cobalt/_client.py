"""What the async and blocking clients share: credentials and request preparation."""

from __future__ import annotations

import os
from typing import Any, Iterable, Optional, Tuple, Union

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
