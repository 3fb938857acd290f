"""Codes, content formats, responses and requests: the values of CoAP messages."""

from __future__ import annotations

import json as _json
from typing import Any, Iterable, List, Optional, Tuple, Union

__all__ = ["Code", "ContentFormat", "Option", "Response", "Request"]

#: Every code by its byte, made once (filled below the class).
_CODE_OF_BYTE: list = []


class Code(int):
    """A CoAP code: a request method (0.01 GET ...) or a response (2.05 Content ...).

    It is the code's byte (``class << 5 | detail``), prints as ``2.05`` and can be made
    from that text: ``Code("4.04") == Code.NOT_FOUND``.
    """

    _names: dict = {}

    def __new__(cls, value: Union[int, str], detail: Optional[int] = None) -> "Code":
        if detail is None:
            # The common cases, without a new object: a code, or its byte.
            if type(value) is Code:
                return value
            if type(value) is int and 0 <= value <= 255:
                return _CODE_OF_BYTE[value]
        if isinstance(value, str):
            try:
                c, d = value.split(".")
                value, detail = int(c), int(d)
            except ValueError:
                raise ValueError(f"{value!r} is not a code like '2.05'") from None
        if detail is not None:
            if not (0 <= value <= 7 and 0 <= detail <= 31):
                raise ValueError(f"{value}.{detail:02} is not a code: class 0-7, detail 0-31")
            value = value << 5 | detail
        if not 0 <= value <= 255:
            raise ValueError(f"{value} is not a code byte (0-255)")
        return super().__new__(cls, value)

    @property
    def code_class(self) -> int:
        """The class: 0 request, 2 success, 4 client error, 5 server error."""
        return int(self) >> 5

    @property
    def detail(self) -> int:
        """The detail, after the dot."""
        return int(self) & 31

    @property
    def name(self) -> str:
        """The RFC's name, e.g. ``Not Found``, or the dotted code if it has none."""
        return self._names.get(int(self), str(self))

    def is_success(self) -> bool:
        """A 2.xx response code."""
        return self.code_class == 2

    def is_error(self) -> bool:
        """A 4.xx or 5.xx response code."""
        return self.code_class in (4, 5)

    def __str__(self) -> str:
        return f"{self.code_class}.{self.detail:02}"

    def __repr__(self) -> str:
        return f"<Code {self} {self.name}>"


_CODES = [
    ("EMPTY", 0, 0, "Empty"),
    ("GET", 0, 1, "GET"),
    ("POST", 0, 2, "POST"),
    ("PUT", 0, 3, "PUT"),
    ("DELETE", 0, 4, "DELETE"),
    ("FETCH", 0, 5, "FETCH"),
    ("PATCH", 0, 6, "PATCH"),
    ("IPATCH", 0, 7, "iPATCH"),
    ("CREATED", 2, 1, "Created"),
    ("DELETED", 2, 2, "Deleted"),
    ("VALID", 2, 3, "Valid"),
    ("CHANGED", 2, 4, "Changed"),
    ("CONTENT", 2, 5, "Content"),
    ("CONTINUE", 2, 31, "Continue"),
    ("BAD_REQUEST", 4, 0, "Bad Request"),
    ("UNAUTHORIZED", 4, 1, "Unauthorized"),
    ("BAD_OPTION", 4, 2, "Bad Option"),
    ("FORBIDDEN", 4, 3, "Forbidden"),
    ("NOT_FOUND", 4, 4, "Not Found"),
    ("METHOD_NOT_ALLOWED", 4, 5, "Method Not Allowed"),
    ("NOT_ACCEPTABLE", 4, 6, "Not Acceptable"),
    ("REQUEST_ENTITY_INCOMPLETE", 4, 8, "Request Entity Incomplete"),
    ("CONFLICT", 4, 9, "Conflict"),
    ("PRECONDITION_FAILED", 4, 12, "Precondition Failed"),
    ("REQUEST_ENTITY_TOO_LARGE", 4, 13, "Request Entity Too Large"),
    ("UNSUPPORTED_CONTENT_FORMAT", 4, 15, "Unsupported Content-Format"),
    ("UNPROCESSABLE_ENTITY", 4, 22, "Unprocessable Entity"),
    ("TOO_MANY_REQUESTS", 4, 29, "Too Many Requests"),
    ("INTERNAL_SERVER_ERROR", 5, 0, "Internal Server Error"),
    ("NOT_IMPLEMENTED", 5, 1, "Not Implemented"),
    ("BAD_GATEWAY", 5, 2, "Bad Gateway"),
    ("SERVICE_UNAVAILABLE", 5, 3, "Service Unavailable"),
    ("GATEWAY_TIMEOUT", 5, 4, "Gateway Timeout"),
    ("PROXYING_NOT_SUPPORTED", 5, 5, "Proxying Not Supported"),
]
_CODE_OF_BYTE.extend(int.__new__(Code, b) for b in range(256))
for _const, _c, _d, _name in _CODES:
    Code._names[_c << 5 | _d] = _name
    setattr(Code, _const, _CODE_OF_BYTE[_c << 5 | _d])

#: Method codes by name, as ``Site.route(methods=...)`` takes them.
METHODS = {name: Code(0, d) for name, c, d, _ in _CODES if c == 0 and d > 0}


class ContentFormat:
    """Content-Format numbers (RFC 7252 §12.3 and the IANA registry)."""

    TEXT = 0
    LINK_FORMAT = 40
    XML = 41
    OCTET_STREAM = 42
    EXI = 47
    JSON = 50
    CBOR = 60
    SENML_JSON = 110
    SENML_CBOR = 112


class Option:
    """Option numbers (RFC 7252 §5.10 and the IANA registry)."""

    IF_MATCH = 1
    URI_HOST = 3
    ETAG = 4
    IF_NONE_MATCH = 5
    OBSERVE = 6
    URI_PORT = 7
    LOCATION_PATH = 8
    URI_PATH = 11
    CONTENT_FORMAT = 12
    MAX_AGE = 14
    URI_QUERY = 15
    ACCEPT = 17
    LOCATION_QUERY = 20
    BLOCK2 = 23
    BLOCK1 = 27
    SIZE2 = 28
    SIZE1 = 60


def encode_uint(value: int) -> bytes:
    """An option's unsigned integer value in its shortest form (0 is empty)."""
    if 0 <= value < 256:
        return _SMALL_UINTS[value]
    if value < 0:
        raise ValueError(f"{value} is negative; option integers are unsigned")
    return value.to_bytes((value.bit_length() + 7) // 8, "big")


_SMALL_UINTS = [bytes([v]) if v else b"" for v in range(256)]


def decode_uint(value: bytes) -> int:
    """An option's unsigned integer value."""
    return int.from_bytes(value, "big")


def as_bytes(payload: Union[str, bytes, bytearray, memoryview, None]) -> bytes:
    """A payload as bytes: text is UTF-8."""
    if payload is None:
        return b""
    if isinstance(payload, str):
        return payload.encode()
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload)
    raise TypeError(f"a payload is str or bytes, not {type(payload).__name__}")


class _Options:
    """Reading options from a list of ``(number, value)`` pairs."""

    options: List[Tuple[int, bytes]]

    def option(self, number: int) -> Optional[bytes]:
        """The first value of option ``number``, or None."""
        for n, v in self.options:
            if n == number:
                return v
        return None

    def option_values(self, number: int) -> List[bytes]:
        """Every value of option ``number``, in order."""
        return [v for n, v in self.options if n == number]

    def _uint(self, number: int) -> Optional[int]:
        v = self.option(number)
        return None if v is None else decode_uint(v)


class Response(_Options):
    """A response: what a client receives, and what a handler may return.

    ``Response(Code.CREATED, location="/items/4")``,
    ``Response(payload="21.5", content_format=ContentFormat.TEXT, max_age=30)``.
    """

    __slots__ = ("code", "payload", "options")

    def __init__(
        self,
        code: Union[Code, int, str] = Code.CONTENT,
        payload: Union[str, bytes, None] = b"",
        *,
        content_format: Optional[int] = None,
        max_age: Optional[int] = None,
        etag: Optional[bytes] = None,
        location: Optional[str] = None,
        options: Iterable[Tuple[int, bytes]] = (),
    ) -> None:
        self.code = code if type(code) is Code else Code(code)
        self.payload = payload if type(payload) is bytes else as_bytes(payload)
        opts = [(int(n), bytes(v)) for n, v in options] if options else []
        if etag is not None:
            opts.append((Option.ETAG, bytes(etag)))
        if location is not None:
            opts.extend((Option.LOCATION_PATH, s.encode()) for s in location.strip("/").split("/") if s)
        if content_format is not None:
            opts.append((Option.CONTENT_FORMAT, encode_uint(content_format)))
        if max_age is not None:
            opts.append((Option.MAX_AGE, encode_uint(max_age)))
        self.options = opts

    @classmethod
    def _from_native(cls, native: Tuple[int, bytes, List[Tuple[int, bytes]]]) -> "Response":
        r = cls.__new__(cls)
        r.code = Code(native[0])
        r.payload = native[1]
        r.options = native[2]
        return r

    @property
    def text(self) -> str:
        """The payload as UTF-8 text (undecodable bytes replaced)."""
        return self.payload.decode(errors="replace")

    def json(self) -> Any:
        """The payload parsed as JSON."""
        return _json.loads(self.payload)

    @property
    def content_format(self) -> Optional[int]:
        """The Content-Format option, if any."""
        return self._uint(Option.CONTENT_FORMAT)

    @property
    def max_age(self) -> Optional[int]:
        """The Max-Age option in seconds, if any (absent means 60)."""
        return self._uint(Option.MAX_AGE)

    @property
    def etag(self) -> Optional[bytes]:
        """The ETag option, if any."""
        return self.option(Option.ETAG)

    @property
    def observe(self) -> Optional[int]:
        """The Observe option (a notification's sequence number), if any."""
        return self._uint(Option.OBSERVE)

    @property
    def location(self) -> Optional[str]:
        """The Location-Path options as a path (``/rd/4``), if any."""
        segments = self.option_values(Option.LOCATION_PATH)
        return "/" + "/".join(s.decode(errors="replace") for s in segments) if segments else None

    def __repr__(self) -> str:
        return f"<Response {self.code} {self.code.name}, {len(self.payload)} bytes>"


class Request(_Options):
    """A request as a handler receives it."""

    __slots__ = ("_native",)

    def __init__(self, native: Any) -> None:
        self._native = native

    @property
    def method(self) -> Code:
        """The method (``Code.GET`` ...)."""
        return _CODE_OF_BYTE[self._native.method]

    @property
    def path(self) -> str:
        """The path, e.g. ``/sensors/temp``."""
        return self._native.path

    @property
    def payload(self) -> bytes:
        """The body (reassembled when it came in Block1 blocks)."""
        return self._native.payload

    @property
    def text(self) -> str:
        """The body as UTF-8 text (undecodable bytes replaced)."""
        return self._native.payload.decode(errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON."""
        return _json.loads(self._native.payload)

    @property
    def query(self) -> List[str]:
        """The Uri-Query items, in order (``["a=1", "b"]``)."""
        return self._native.query

    def query_param(self, name: str) -> Optional[str]:
        """The value of ``name=value`` in the query (``""`` for a bare ``name``), or None."""
        for item in self._native.query:
            key, eq, value = item.partition("=")
            if key == name:
                return value if eq else ""
        return None

    @property
    def params(self) -> dict:
        """The route's path parameters (``/items/{id}``) by name."""
        return self._native.params

    @property
    def content_format(self) -> Optional[int]:
        """The Content-Format option, if any."""
        return self._native.content_format

    @property
    def accept(self) -> Optional[int]:
        """The Accept option, if any."""
        return self._native.accept

    @property
    def peer(self) -> Tuple[str, int]:
        """Who sent it: ``(host, port)``."""
        return self._native.peer

    @property
    def scheme(self) -> str:
        """The transport: ``coap``, ``coaps``, ``coap+tcp``, ``coaps+tcp``, ``coap+ws``, ``coaps+ws``."""
        return self._native.scheme

    @property
    def psk_identity(self) -> Optional[bytes]:
        """The PSK identity the peer authenticated with (DTLS, TLS), if any."""
        return self._native.psk_identity

    @property
    def certificate_subject(self) -> Optional[str]:
        """The subject of the peer's verified certificate (DTLS, TLS), if any."""
        return self._native.certificate_subject

    @property
    def options(self) -> List[Tuple[int, bytes]]:  # type: ignore[override]
        """Every option, in order, as ``(number, value)``."""
        return self._native.options

    def __repr__(self) -> str:
        return f"<Request {self.method.name} {self.path} from {self.peer[0]}:{self.peer[1]}>"


def payload_and_format(body: Any) -> Tuple[bytes, Optional[int]]:
    """What a handler's body becomes: text (Content-Format text/plain), bytes (none),
    a dict or list (JSON)."""
    if isinstance(body, str):
        return body.encode(), ContentFormat.TEXT
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body), None
    if isinstance(body, (dict, list)):
        return _json.dumps(body).encode(), ContentFormat.JSON
    raise TypeError(
        f"a handler answers str, bytes, a dict or list (JSON), a Code, a (code, body) "
        f"pair or a cobalt.Response, not {type(body).__name__}"
    )


def answer_of(result: Any, method: int) -> Response:
    """A handler's result as a response; the code for a bare body follows the method."""
    if isinstance(result, Response):
        return result
    if isinstance(result, Code):
        return Response(result)
    code = _DEFAULT_CODE.get(method, Code.CONTENT)
    if isinstance(result, tuple) and len(result) == 2:
        code, result = Code(result[0]), result[1]
    if result is None:
        return Response(code)
    payload, cf = payload_and_format(result)
    return Response(code, payload, content_format=cf)


_DEFAULT_CODE = {
    int(Code.GET): Code.CONTENT,
    int(Code.FETCH): Code.CONTENT,
    int(Code.POST): Code.CHANGED,
    int(Code.PUT): Code.CHANGED,
    int(Code.PATCH): Code.CHANGED,
    int(Code.IPATCH): Code.CHANGED,
    int(Code.DELETE): Code.DELETED,
}
