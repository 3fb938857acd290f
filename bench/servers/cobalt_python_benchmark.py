#!/usr/bin/env python3
"""A Cobalt server with a Python handler, for bench/python.sh: GET /benchmark -> 2.05
"hello world", the same handler as aiocoap_benchmark.py's (an async function).

Usage: cobalt_python_benchmark.py [HOST] [PORT] [SHARDS]   (default 127.0.0.1 5683 1)
Needs the cobalt package (cobalt-python; bench/python.sh builds it with maturin).
"""

import asyncio
import sys

import cobalt

site = cobalt.Site()


@site.route("/benchmark")
async def benchmark(request: cobalt.Request) -> cobalt.Response:
    return cobalt.Response(cobalt.Code.CONTENT, b"hello world", content_format=0)


async def serve(host: str, port: int, shards: int) -> None:
    server = await site.start(host, port, shards=shards)
    print(f"cobalt (Python handler) benchmark server on {server.uri(path='/benchmark')}", file=sys.stderr, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.shutdown(0)


if __name__ == "__main__":
    bind_host = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"
    bind_port = int(sys.argv[2]) if len(sys.argv) > 2 else 5683
    shard_count = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    try:
        asyncio.run(serve(bind_host, bind_port, shard_count))
    except KeyboardInterrupt:
        pass
