"""Interoperability: Cobalt's Python client against aiocoap and libcoap servers, and
aiocoap-client and libcoap's coap-client against a Python-defined Cobalt server."""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator, List

import pytest
from conftest import PSK_IDENTITY, PSK_KEY, ROOT, aiocoap_python, big_text, free_port, require_peer, wait_for_udp

import cobalt
from cobalt import Code, ContentFormat

AIOCOAP_SERVER = ROOT / "tests" / "peers" / "aiocoap_server.py"


def libcoap(tool: str) -> str:
    path = shutil.which(tool)
    require_peer(f"libcoap's {tool} (Debian libcoap3-bin)", path is not None)
    assert path is not None
    return path


def aiocoap_bin() -> Path:
    python = aiocoap_python()
    require_peer("aiocoap (.venv-peers)", python is not None)
    assert python is not None
    return python.parent


class Process:
    """A peer process, killed at the end."""

    def __init__(self, args: List[str]) -> None:
        # Unbuffered, so that a Python peer's lines come as they are printed.
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)

    def stop(self) -> str:
        self.proc.kill()
        out, _ = self.proc.communicate(timeout=10)
        return out


@pytest.fixture(scope="module")
def aiocoap_server() -> Iterator[int]:
    """tests/peers/aiocoap_server.py on UDP, TCP and WebSockets (port + 3000)."""
    python = aiocoap_bin() / "python"
    port = free_port()
    server = Process([str(python), str(AIOCOAP_SERVER), "--port", str(port), "--transports", "udp6,tcpserver,ws"])
    try:
        wait_for_udp(port)
        yield port
    finally:
        server.stop()


@pytest.mark.parametrize("scheme", ["coap", "coap+tcp", "coap+ws"])
def test_every_call_against_aiocoap(aiocoap_server, run, scheme):
    port = aiocoap_server + 3000 if scheme == "coap+ws" else aiocoap_server
    base = f"{scheme}://127.0.0.1:{port}"

    async def main():
        r = await cobalt.get(f"{base}/hello")
        assert (r.code, r.text, r.content_format) == (Code.CONTENT, "hello from aiocoap", ContentFormat.TEXT)
        r = await cobalt.post(f"{base}/echo", "posted", content_format=ContentFormat.TEXT)
        assert (r.code, r.text, r.content_format) == (Code.CHANGED, "posted", ContentFormat.TEXT)
        r = await cobalt.put(f"{base}/echo", b"\x01" * 2500, block_size=512)
        assert (r.code, r.payload) == (Code.CHANGED, b"\x01" * 2500)
        r = await cobalt.get(f"{base}/large")
        assert len(r.payload) == 3000 and r.payload.startswith(b"line 0000: abc")
        with pytest.raises(cobalt.ResponseError) as e:
            await cobalt.delete(f"{base}/echo")
        assert e.value.code == Code.METHOD_NOT_ALLOWED
        with pytest.raises(cobalt.ResponseError) as e:
            await cobalt.fetch(f"{base}/hello", "q")
        assert e.value.code == Code.METHOD_NOT_ALLOWED
        with pytest.raises(cobalt.ResponseError) as e:
            await cobalt.get(f"{base}/missing")
        assert e.value.code == Code.NOT_FOUND
        counts = []
        async for n in cobalt.observe(f"{base}/counter"):
            counts.append(int(n.text.split()[1]))
            if len(counts) == 3:
                break
        assert counts == sorted(counts) and len(set(counts)) == 3

    run(main())


@pytest.fixture(scope="module")
def libcoap_server() -> Iterator[int]:
    """coap-server-openssl: coap and coap+tcp on the port, coaps (PSK) on port + 1;
    up to 10 resources made by PUT."""
    tool = libcoap("coap-server-openssl")
    port = free_port()
    while not _free_udp(port + 1):
        port = free_port()
    server = Process([tool, "-A", "127.0.0.1", "-p", str(port), "-d", "10", "-k", PSK_KEY, "-v", "0"])
    try:
        wait_for_udp(port)
        yield port
    finally:
        server.stop()


def _free_udp(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("scheme", ["coap", "coap+tcp", "coaps"])
def test_every_call_against_libcoap(libcoap_server, run, scheme):
    port = libcoap_server + 1 if scheme == "coaps" else libcoap_server
    base = f"{scheme}://127.0.0.1:{port}"
    client = cobalt.Client(psk=(PSK_IDENTITY, PSK_KEY)) if scheme == "coaps" else cobalt.Client()
    resource = f"{base}/cobalt-{scheme.replace('+', '-')}"

    async def main():
        r = await client.get(f"{base}/")
        assert r.code == Code.CONTENT and "libcoap" in r.text
        body = big_text(3000)
        r = await client.put(resource, body, content_format=ContentFormat.TEXT, block_size=512)
        assert r.code == Code.CREATED
        r = await client.get(resource)
        assert r.text == body
        r = await client.post(resource, "more", check=False)
        assert r.code in (Code.CHANGED, Code.CREATED, Code.METHOD_NOT_ALLOWED)
        r = await client.fetch(resource, "q", check=False)
        assert r.code in (Code.CONTENT, Code.METHOD_NOT_ALLOWED)
        r = await client.delete(resource)
        assert r.code == Code.DELETED
        with pytest.raises(cobalt.ResponseError) as e:
            await client.get(resource)
        assert e.value.code == Code.NOT_FOUND
        seen = []
        async for n in client.observe(f"{base}/time"):
            seen.append(n)
            if len(seen) == 2:
                break
        assert all(n.code == Code.CONTENT for n in seen)
        assert seen[1].observe is not None

    run(main())


class Ticker:
    """Calls ``resource.changed()`` every 0.2 s on a thread while it runs."""

    def __init__(self, state, resource) -> None:
        self.stop_event = threading.Event()
        self.state, self.resource = state, resource
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop_event.wait(0.2):
            self.state.temperature += 1
            self.resource.changed()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join()


def _notifications(proc: Process, count: int, deadline: float = 15.0) -> List[str]:
    """The first ``count`` numeric lines of output (the temperatures), or as many as
    came within ``deadline`` seconds."""
    lines: "queue.Queue[str]" = queue.Queue()
    assert proc.proc.stdout is not None
    stdout = proc.proc.stdout
    threading.Thread(target=lambda: [lines.put(x) for x in stdout], daemon=True).start()
    values: List[str] = []
    end = time.monotonic() + deadline
    while len(values) < count and time.monotonic() < end:
        try:
            line = lines.get(timeout=max(0.0, end - time.monotonic())).strip()
        except queue.Empty:
            break
        last = line.split()[-1] if line else ""
        if last.isdigit():
            values.append(last)
    return values


def test_aiocoap_client_against_a_python_cobalt_server(served):
    server, state, temp = served
    client = str(aiocoap_bin() / "aiocoap-client")

    def ask(*args: str) -> str:
        done = subprocess.run([client, *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert ask(server.uri("coap", "/hello?name=aiocoap")) == "hello aiocoap"
    assert ask(server.uri("coap", "/big")) == big_text(5000).strip()
    assert ask(server.uri("coap+tcp", "/big")) == big_text(5000).strip()
    assert ask("-m", "POST", "--payload", "from aiocoap", server.uri("coap", "/echo")) == "from aiocoap"
    # aiocoap-client prints only the first response of an observation when its output
    # is not a terminal: tests/peers/aiocoap_observe.py observes with aiocoap instead.
    observe = ROOT / "tests" / "peers" / "aiocoap_observe.py"
    proc = Process([str(aiocoap_bin() / "python"), str(observe), server.uri("coap", "/temp"), "3"])
    ticker = Ticker(state, temp)
    try:
        values = [int(v) for v in _notifications(proc, 3)]
    finally:
        ticker.stop()
        proc.stop()
    assert len(values) == 3 and values == sorted(values) and len(set(values)) == 3


def test_libcoap_client_against_a_python_cobalt_server(served):
    server, state, temp = served
    client = libcoap("coap-client-notls")

    def ask(*args: str) -> str:
        done = subprocess.run([client, "-B", "5", *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert ask(server.uri("coap", "/hello?name=libcoap")).strip() == "hello libcoap"
    assert ask(server.uri("coap", "/big")) .rstrip("\n") == big_text(5000).rstrip("\n")
    assert ask(server.uri("coap+tcp", "/hello")).strip() == "hello world"
    assert ask("-m", "put", "-e", "from libcoap", server.uri("coap", "/store")) == ""
    assert ask(server.uri("coap", "/store")).strip() == "from libcoap"
    proc = Process([client, "-s", "10", "-B", "10", server.uri("coap", "/temp")])
    ticker = Ticker(state, temp)
    try:
        values = [int(v) for v in _notifications(proc, 3)]
    finally:
        ticker.stop()
        proc.stop()
    assert len(values) == 3 and values == sorted(values) and len(set(values)) == 3
