"""Fixtures: a Python-defined Cobalt server running on an event loop of its own (as a
service would), credentials, and the peers (aiocoap, libcoap) the interop tests use.

Peers that are missing skip their tests, unless COBALT_REQUIRE_PEERS=1 (as
scripts/test.sh sets): then they fail.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

import cobalt

ROOT = Path(__file__).resolve().parents[2]
PSK_IDENTITY = "python-test"
PSK_KEY = "secretPSK"


def require_peer(what: str, found: bool) -> None:
    """Skips (or fails, with COBALT_REQUIRE_PEERS=1) when a peer is missing."""
    if found:
        return
    message = f"{what} is not installed (scripts/install-test-deps.sh installs it)"
    if os.environ.get("COBALT_REQUIRE_PEERS") == "1":
        pytest.fail(message)
    pytest.skip(message)


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    """A port free now for UDP and TCP on 127.0.0.1."""
    while True:
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        other = socket.SOCK_STREAM if kind == socket.SOCK_DGRAM else socket.SOCK_DGRAM
        with socket.socket(socket.AF_INET, other) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def big_text(n: int) -> str:
    """``n`` characters of numbered lines, to check a reassembled body byte for byte."""
    out = "".join(f"line {i:04}\n" for i in range(n // 10 + 1))
    return out[:n]


class State:
    """What the test site's handlers share."""

    def __init__(self) -> None:
        self.temperature = 20
        self.stored = b""
        #: Handlers of /gate waiting, and the event that lets them all go.
        self.at_gate = 0
        self.gate: Optional[asyncio.Event] = None


def make_site(state: State) -> "tuple[cobalt.Site, cobalt.Resource]":
    """The test site: the resources every server-side test talks to."""
    site = cobalt.Site()

    @site.route("/hello", rt="greeting", ct=0)
    async def hello(request: cobalt.Request) -> str:
        name = request.query_param("name") or "world"
        return f"hello {name}"

    @site.route("/echo", methods=["POST", "PUT", "FETCH", "PATCH", "IPATCH"])
    def echo(request: cobalt.Request) -> cobalt.Response:
        return cobalt.Response(cobalt.Code.CHANGED if request.method != cobalt.Code.FETCH else cobalt.Code.CONTENT,
                               request.payload, content_format=request.content_format)

    @site.route("/store", methods=["GET", "PUT", "DELETE"])
    async def store(request: cobalt.Request) -> Any:
        if request.method == cobalt.Code.PUT:
            state.stored = request.payload
            return cobalt.Code.CHANGED
        if request.method == cobalt.Code.DELETE:
            state.stored = b""
            return None
        return state.stored

    @site.route("/temp", observable=True, rt="temperature", interface="sensor")
    async def temp(request: cobalt.Request) -> str:
        await asyncio.sleep(0)  # a handler that really suspends
        # One line each: libcoap's coap-client prints payloads as they are.
        return f"{state.temperature}\n"

    @temp.put
    async def set_temp(request: cobalt.Request) -> cobalt.Code:
        state.temperature = int(request.text)
        temp.changed()
        return cobalt.Code.CHANGED

    @site.route("/big")
    async def big(request: cobalt.Request) -> str:
        return big_text(5000)

    @site.route("/forbidden")
    async def forbidden(request: cobalt.Request) -> str:
        raise cobalt.ResponseError(cobalt.Code.FORBIDDEN, "not for you")

    @site.route("/broken")
    async def broken(request: cobalt.Request) -> str:
        raise RuntimeError("a bug")

    @site.route("/slow")
    async def slow(request: cobalt.Request) -> str:
        await asyncio.sleep(float(request.query_param("s") or "0.2"))
        return "slow"

    @site.route("/gate")
    async def gate(request: cobalt.Request) -> str:
        """Waits until ``?n=N`` requests are in their handlers at once (or 5 s)."""
        if state.gate is None:
            state.gate = asyncio.Event()
        state.at_gate += 1
        if state.at_gate >= int(request.query_param("n") or "1"):
            state.gate.set()
        try:
            await asyncio.wait_for(state.gate.wait(), 5)
        except asyncio.TimeoutError:
            pass
        return str(state.at_gate)

    @site.route("/items/{id}")
    async def item(request: cobalt.Request) -> dict:
        return {"id": request.params["id"], "peer": request.scheme}

    @site.route("/whoami")
    async def whoami(request: cobalt.Request) -> str:
        identity = request.psk_identity
        return identity.decode() if identity else (request.certificate_subject or "anonymous")

    @site.route("/counter")
    class Counter:
        def __init__(self) -> None:
            self.n = 0

        async def get(self, request: cobalt.Request) -> str:
            return str(self.n)

        async def post(self, request: cobalt.Request) -> cobalt.Response:
            self.n += 1
            return cobalt.Response(cobalt.Code.CHANGED, str(self.n))

    return site, temp


class BackgroundServer:
    """A site served from an event loop on a thread of its own."""

    def __init__(self, site: cobalt.Site, **kwargs: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-server-loop", daemon=True)
        self.thread.start()
        self.server: cobalt.Server = self.run(site.start(**kwargs))

    def run(self, coro: Any) -> Any:
        """Runs ``coro`` on the server's loop and returns its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def uri(self, scheme: str = "coap", path: str = "") -> str:
        return self.server.uri(scheme, path)

    def stop(self) -> None:
        self.run(self.server.shutdown(0.5))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def make_pki(directory: Path) -> dict:
    """A CA and a server certificate for 127.0.0.1 (EC P-256), made with openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key")
    run("req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=cobalt-python-test-ca", "-days", "2", "-out", "ca.pem")
    for name, san in (("server", "IP:127.0.0.1,DNS:localhost"), ("client", "DNS:client")):
        run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key")
        run("req", "-new", "-key", f"{name}.key", "-subj", f"/CN={name}", "-out", f"{name}.csr")
        (directory / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext")
    return {k: directory / f"{k}" for k in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def served(pki: dict) -> Iterator[tuple]:
    """The test site on every scheme (any free ports), the secure ones with certificates."""
    state = State()
    site, temp = make_site(state)
    server = BackgroundServer(
        site, host="127.0.0.1", port=0, tcp=0, ws=0, dtls=0, tls=0, wss=0,
        cert=pki["server.pem"], key=pki["server.key"],
    )
    yield server, state, temp
    server.stop()


@pytest.fixture(scope="module")
def served_psk() -> Iterator[BackgroundServer]:
    """The test site on the secure schemes with a pre-shared key (a server with
    certificates too would have TLS clients verify them instead)."""
    site, _ = make_site(State())
    server = BackgroundServer(site, host="127.0.0.1", port=0, dtls=0, tls=0, wss=0, psk={PSK_IDENTITY: PSK_KEY})
    yield server
    server.stop()


def aiocoap_python() -> Optional[Path]:
    """The Python of the venv that has aiocoap (``.venv-peers``), if any."""
    for base in (os.environ.get("COBALT_AIOCOAP_BIN"), str(ROOT / ".venv-peers" / "bin")):
        if base and (Path(base) / "aiocoap-client").exists():
            return Path(base) / "python"
    return None


def wait_for_udp(port: int, deadline: float = 10.0) -> None:
    """Waits until a CoAP server answers a ping on ``port``."""
    end = time.monotonic() + deadline
    ping = bytes([0x40, 0x00, 0x12, 0x34])  # CON, empty, MID 0x1234
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.2)
        while time.monotonic() < end:
            s.sendto(ping, ("127.0.0.1", port))
            try:
                s.recvfrom(64)
                return
            except OSError:
                time.sleep(0.1)
    raise RuntimeError(f"no CoAP server answered on UDP port {port}")


@pytest.fixture
def run() -> Any:
    """Runs a coroutine on a fresh event loop (the client's side of a test)."""
    return asyncio.run


sys.path.insert(0, str(Path(__file__).parent))
