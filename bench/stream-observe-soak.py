#!/usr/bin/env python3
"""Observers over CoAP over TCP (RFC 8323) for minutes, with connection churn.

Starts `cobalt serve --tcp --metrics` (default configuration otherwise) pinned to the
server CPU, opens --connections connections from --ips loopback addresses (127.0.0.2
on), each registering an observation of the demo's /obs (it changes every second),
and every --churn seconds closes a tenth of them and, once they are closed, opens new
ones in their place.
Counts the 2.05 notifications the observers receive per second, samples the server's
RSS and its relation gauge (cobalt_connection_observers), and at the end closes every
connection and checks that the gauge and the resource's observers go back to zero.

Usage: bench/stream-observe-soak.py [--cobalt target/release/cobalt]
         [--connections 1000] [--ips 8] [--seconds 180] [--churn 10] [--sample 10]
         [--port 5783] [--metrics-port 9783] [--server-cpus 1] [--out bench/results]
Writes bench/results/stream-observe-soak-<date>.md.
"""

import argparse
import asyncio
import datetime
import os
import random
import statistics
import subprocess
import time
import urllib.request

CSM = bytes([0x00, 0xE1])  # 7.01 CSM, no options: the defaults of RFC 8323 §5.3
CONTENT = 0x45  # 2.05
PING, PONG, ABORT = 0xE2, 0xE3, 0xE5  # 7.02, 7.03, 7.05 (RFC 8323 §5.4, §5.6)


def observe_get(token: bytes) -> bytes:
    """GET /obs with Observe=0 (RFC 7641), framed for RFC 8323 §3.2."""
    opts = bytes([0x60, 0x53]) + b"obs"  # Observe (6), empty; Uri-Path (11) "obs"
    return bytes([(len(opts) << 4) | len(token), 0x01]) + token + opts


async def read_message(reader: asyncio.StreamReader):
    """One framed message: (code, token, options and payload)."""
    first = (await reader.readexactly(1))[0]
    length, tkl = first >> 4, first & 0x0F
    if length == 13:
        length = 13 + (await reader.readexactly(1))[0]
    elif length == 14:
        length = 269 + int.from_bytes(await reader.readexactly(2), "big")
    elif length == 15:
        length = 65805 + int.from_bytes(await reader.readexactly(4), "big")
    code = (await reader.readexactly(1))[0]
    token = await reader.readexactly(tkl)
    rest = await reader.readexactly(length)
    return code, token, rest


class Counts:
    def __init__(self):
        self.notifications = 0
        self.other = 0
        self.refused = 0
        self.closed_by_server = 0
        self.aborts = {}  # diagnostic payload -> count


async def observer(host: str, port: int, source: str, counts: Counts, stop: asyncio.Event):
    """One connection observing /obs until `stop` is set."""
    token = random.randbytes(4)
    try:
        reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
    except OSError:
        counts.refused += 1
        return
    writer.write(CSM + observe_get(token))
    try:
        while not stop.is_set():
            read = asyncio.ensure_future(read_message(reader))
            waiter = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({read, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if read not in done:
                read.cancel()
                break
            waiter.cancel()
            code, tok, rest = read.result()
            if code == PING:
                writer.write(bytes([len(tok), PONG]) + tok)
                continue
            if code == ABORT:
                why = rest.split(b"\xff", 1)[-1].decode(errors="replace")
                counts.aborts[why] = counts.aborts.get(why, 0) + 1
                continue
            if tok != token or code >> 5 == 7:  # other signals (CSM) and others
                continue
            if code == CONTENT:
                counts.notifications += 1
            else:
                counts.other += 1
    except (asyncio.IncompleteReadError, ConnectionError):
        counts.closed_by_server += 1
    finally:
        writer.close()


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def gauge(metrics_port: int, name: str) -> float:
    """The sum of a metric family's samples."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cobalt", default="target/release/cobalt")
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--ips", type=int, default=8)
    p.add_argument("--seconds", type=int, default=180)
    p.add_argument("--churn", type=float, default=10)
    p.add_argument("--sample", type=float, default=10)
    p.add_argument("--port", type=int, default=5783)
    p.add_argument("--metrics-port", type=int, default=9783)
    p.add_argument("--server-cpus", default="1")
    p.add_argument("--out", default="bench/results")
    a = p.parse_args()

    server = subprocess.Popen(
        ["taskset", "-c", a.server_cpus, a.cobalt, "serve", "--bind", "127.0.0.1",
         "--port", str(a.port), "--tcp", str(a.port), "--metrics",
         f"127.0.0.1:{a.metrics_port}", "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                gauge(a.metrics_port, "cobalt_connection_observers")
                break
            except OSError:
                await asyncio.sleep(0.1)
        counts, stop = Counts(), asyncio.Event()
        sources = [f"127.0.0.{2 + i}" for i in range(a.ips)]
        conns = []  # (task, its stop event)

        def open_one(i):
            ev = asyncio.Event()
            t = asyncio.ensure_future(
                observer("127.0.0.1", a.port, sources[i % len(sources)], counts, ev))
            conns.append((t, ev))

        for i in range(a.connections):
            open_one(i)
        start = time.monotonic()
        samples = []  # (t, notifications/s, RSS MiB, relations)
        last_n, last_t, next_churn, churned = 0, start, start + a.churn, 0
        while time.monotonic() - start < a.seconds:
            await asyncio.sleep(a.sample)
            now = time.monotonic()
            if now >= next_churn:
                gone = [conns.pop(random.randrange(len(conns))) for _ in range(len(conns) // 10)]
                for _, ev in gone:
                    ev.set()
                # Closed first: the server counts a connection per address until it
                # has seen the close.
                await asyncio.gather(*(t for t, _ in gone), return_exceptions=True)
                await asyncio.sleep(0.5)
                for _ in gone:
                    open_one(churned)
                    churned += 1
                next_churn = now + a.churn
            n = counts.notifications
            rate = (n - last_n) / (now - last_t)
            last_n, last_t = n, now
            rel = gauge(a.metrics_port, "cobalt_connection_observers")
            samples.append((now - start, rate, rss_kib(server.pid) / 1024, rel))
            print(f"{now - start:6.0f} s  {rate:8.0f} notifications/s  "
                  f"RSS {samples[-1][2]:6.1f} MiB  relations {rel:.0f}", flush=True)
        for t, ev in conns:
            ev.set()
        await asyncio.gather(*(t for t, _ in conns), return_exceptions=True)
        await asyncio.sleep(2)
        after = gauge(a.metrics_port, "cobalt_connection_observers")
        observers = gauge(a.metrics_port, "cobalt_observers")
        rss_end = rss_kib(server.pid) / 1024
    finally:
        server.terminate()
        server.wait()

    steady = [s for s in samples if s[0] >= 60] or samples
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d-%H%M")
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"stream-observe-soak-{date}.md")
    with open(path, "w") as f:
        f.write("# Observers over coap+tcp with connection churn\n\n")
        f.write(f"- command: `bench/stream-observe-soak.py --connections {a.connections} "
                f"--ips {a.ips} --seconds {a.seconds} --churn {a.churn}`\n")
        f.write(f"- server: `{a.cobalt} serve --tcp --metrics` (default configuration), "
                f"CPU {a.server_cpus}; /obs changes every second\n")
        f.write(f"- connections replaced by churn: {churned}; refused: {counts.refused}; "
                f"closed by the server: {counts.closed_by_server}; "
                f"non-2.05 answers: {counts.other}; Abort from the server: "
                f"{counts.aborts or 'none'}\n")
        f.write(f"- after 60 s: notifications/s median "
                f"{statistics.median(s[1] for s in steady):.0f}; RSS "
                f"{min(s[2] for s in steady):.1f}–{max(s[2] for s in steady):.1f} MiB; "
                f"relations {min(s[3] for s in steady):.0f}–{max(s[3] for s in steady):.0f}\n")
        f.write(f"- all connections closed: relations gauge {after:.0f}, "
                f"cobalt_observers {observers:.0f}, RSS {rss_end:.1f} MiB\n\n")
        f.write("| s | notifications/s | RSS MiB | relations |\n|---|---|---|---|\n")
        for t, rate, rss, rel in samples:
            f.write(f"| {t:.0f} | {rate:.0f} | {rss:.1f} | {rel:.0f} |\n")
    print(f"report: {path}")
    print(f"relations after close: {after:.0f}; cobalt_observers: {observers:.0f}; "
          f"closed by the server: {counts.closed_by_server}; aborts: {counts.aborts}")


if __name__ == "__main__":
    asyncio.run(main())
