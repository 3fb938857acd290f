"""Failures surface as the documented exceptions; shutting down leaves no thread."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import threading
import time

import pytest
from conftest import BackgroundServer, State, free_port, make_site

import cobalt


class Silent:
    """A UDP socket that reads requests and answers nothing, or answers RST."""

    def __init__(self, reset: bool) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)  # so that the thread sees close() and ends
        self.closed = False
        self.port = self.sock.getsockname()[1]
        self.reset = reset
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.closed:
            try:
                data, peer = self.sock.recvfrom(2048)
            except socket.timeout:
                continue
            except OSError:
                return
            if self.reset and len(data) >= 4:
                # RST (type 3), no token, empty code, the request's message ID.
                self.sock.sendto(bytes([0x70, 0x00, data[2], data[3]]), peer)

    def close(self) -> None:
        self.closed = True
        self.thread.join()
        self.sock.close()


def test_no_answer_is_a_timeout(run):
    silent = Silent(reset=False)

    async def main():
        with pytest.raises(cobalt.Timeout):
            await cobalt.get(f"coap://127.0.0.1:{silent.port}/x", timeout=0.3)

    try:
        run(main())
    finally:
        silent.close()


def test_rst_is_a_reset(run):
    rst = Silent(reset=True)

    async def main():
        with pytest.raises(cobalt.Reset) as e:
            await cobalt.get(f"coap://127.0.0.1:{rst.port}/x", timeout=5)
        assert "RST" in str(e.value)

    try:
        run(main())
    finally:
        rst.close()


def test_nothing_listening_is_unreachable_or_refused(run):
    port = free_port()

    async def main():
        with pytest.raises(cobalt.Unreachable):
            await cobalt.get(f"coap://127.0.0.1:{port}/x", timeout=5)
        with pytest.raises(cobalt.ConnectionFailed):
            await cobalt.get(f"coap+tcp://127.0.0.1:{port}/x", timeout=5)

    run(main())


def test_bad_uris_and_arguments(run):
    async def main():
        with pytest.raises(cobalt.BadUri):
            await cobalt.get("http://127.0.0.1/x")
        with pytest.raises(ValueError):
            await cobalt.request("BREW", "coap://127.0.0.1/x")
        with pytest.raises(ValueError):
            cobalt.Client(psk=("only-identity", b"k"), ca=b"pem")

    run(main())
    with pytest.raises(cobalt.BadUri):
        cobalt.blocking.get("coap://")


def test_a_busy_port_fails_start_with_os_error(run):
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", 0))
    site, _ = make_site(State())

    async def main():
        with pytest.raises(OSError, match="cannot start the server"):
            await site.start("127.0.0.1", taken.getsockname()[1])

    try:
        run(main())
    finally:
        taken.close()


def test_config_file_settings_are_used(tmp_path, run):
    port = free_port()
    config = tmp_path / "cobalt.toml"
    config.write_text(f'[server]\nbind = "127.0.0.1"\nport = {port}\n\n[runtime]\nshards = 1\n')
    site, _ = make_site(State())

    async def main():
        server = await site.start(config=config)
        try:
            assert server.addresses["coap"] == ("127.0.0.1", port)
            assert (await cobalt.get(f"coap://127.0.0.1:{port}/hello")).text == "hello world"
        finally:
            await server.shutdown()
        bad = tmp_path / "bad.toml"
        bad.write_text("[server]\nport = 99999\n")
        with pytest.raises(ValueError, match="port"):
            await site.start(config=bad)

    run(main())


def test_each_event_loop_releases_its_inbox():
    """A program that calls asyncio.run again and again keeps no socket per loop."""
    site, _ = make_site(State())
    server = BackgroundServer(site, host="127.0.0.1", port=0)

    async def ask():
        return (await cobalt.get(server.uri("coap", "/hello"))).text

    try:
        assert asyncio.run(ask()) == "hello world"
        gc.collect()
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(30):
            assert asyncio.run(ask()) == "hello world"
        gc.collect()
        assert len(os.listdir("/proc/self/fd")) <= before + 2
    finally:
        server.stop()


def os_threads() -> "set[str]":
    """The threads of this process (their ids), Python's and native ones."""
    return set(os.listdir("/proc/self/task"))


def threads_left(before: "set[str]") -> "dict[str, str]":
    """The threads started since `before` that are still listed, by id with their names.

    A joined thread leaves /proc/self/task a moment after its join returns (the kernel
    wakes the joiner before it has removed the thread), so the listing gets up to 2 s
    to settle: a thread that was not joined is still there then.
    """
    deadline = time.monotonic() + 2.0
    while True:
        left = os_threads() - before
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    names = {}
    for tid in left:
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                names[tid] = comm.read().strip()
        except OSError:
            pass  # it went meanwhile
    return names


def test_shutdown_joins_every_thread():
    cobalt.shutdown()
    threads_before, python_before = os_threads(), set(threading.enumerate())
    site, temp = make_site(State())
    server = BackgroundServer(site, host="127.0.0.1", port=0, tcp=0, ws=0, shards=2)

    async def client_side():
        assert (await cobalt.get(server.uri("coap", "/hello"))).text == "hello world"
        assert (await cobalt.get(server.uri("coap+tcp", "/big"))).code == cobalt.Code.CONTENT
        observation = cobalt.observe(server.uri("coap+ws", "/temp"))
        await observation.__anext__()
        observation.close()

    asyncio.run(client_side())
    assert cobalt.blocking.get(server.uri("coap", "/hello")).text == "hello world"
    assert os_threads() - threads_before, "Cobalt runs threads of its own"
    server.stop()
    cobalt.shutdown()
    assert not cobalt._cobalt.is_running()
    assert set(threading.enumerate()) <= python_before
    left = threads_left(threads_before)
    assert not left, f"threads started since are still there: {left}"
    # And Cobalt starts again on the next use.
    site2, _ = make_site(State())
    again = BackgroundServer(site2, host="127.0.0.1", port=0)
    assert cobalt.blocking.get(again.uri("coap", "/hello")).text == "hello world"
    again.stop()
    cobalt.shutdown()
