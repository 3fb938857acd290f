"""The exceptions of the client and server, one per kind of failure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

if TYPE_CHECKING:
    from ._message import Code, Response

__all__ = [
    "CoapError",
    "Timeout",
    "Reset",
    "Unreachable",
    "BadUri",
    "ConnectionFailed",
    "HandshakeFailed",
    "CredentialsError",
    "BlockTransferError",
    "ObservationLost",
    "Unsupported",
    "ResponseError",
]


class CoapError(Exception):
    """Base of every Cobalt error; its message says what happened and what to try."""


class Timeout(CoapError):
    """No answer: the retransmissions ran out, or the call's ``timeout`` passed."""


class Reset(CoapError):
    """The peer rejected the request with RST."""


class Unreachable(CoapError):
    """Nothing receives at the peer's address (the network said so: ICMP)."""


class BadUri(CoapError, ValueError):
    """The URI does not parse, has an unknown scheme, or its host does not resolve."""


class ConnectionFailed(CoapError):
    """A ``coap+tcp``, ``coaps+tcp``, ``coap+ws`` or ``coaps+ws`` connection failed."""


class HandshakeFailed(CoapError):
    """The DTLS or TLS handshake failed (wrong key, untrusted certificate, ...)."""


class CredentialsError(CoapError):
    """Keys or certificates could not be read or used."""


class BlockTransferError(CoapError):
    """A block-wise transfer (RFC 7959) could not be completed."""


class ObservationLost(CoapError):
    """An observation fell silent and registering again brought nothing back."""


class Unsupported(CoapError):
    """What was asked is not available in this build or for this scheme."""


class ResponseError(CoapError):
    """The server answered with a 4.xx or 5.xx code.

    A client raises it (unless called with ``check=False``); a handler may raise it to
    answer with ``code`` and ``message`` as the payload.
    """

    def __init__(self, code: "Code | int | str", message: str = "", response: "Response | None" = None) -> None:
        from ._message import Code

        self.code = Code(code)
        #: The whole response, when a client received it.
        self.response = response
        self.message = message
        super().__init__(f"{self.code} {self.code.name}" + (f": {message}" if message else ""))


_KINDS = {cls.__name__: cls for cls in (
    CoapError, Timeout, Reset, Unreachable, BadUri, ConnectionFailed, HandshakeFailed,
    CredentialsError, BlockTransferError, ObservationLost, Unsupported,
)}


def from_native(error: Tuple[str, str]) -> CoapError:
    """The exception for the native core's ``(kind, message)``."""
    kind, message = error
    return _KINDS.get(kind, CoapError)(message)


def check(response: "Response") -> "Response":
    """``response`` if it is not an error code, else its ``ResponseError``."""
    if response.code.is_error():
        raise ResponseError(response.code, response.text, response)
    return response
