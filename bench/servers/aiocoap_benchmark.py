#!/usr/bin/env python3
"""A minimal aiocoap server for bench/compare.sh: GET /benchmark -> 2.05 "hello world".

Usage: aiocoap_benchmark.py [HOST] [PORT]   (default 127.0.0.1 5683)
Needs aiocoap (scripts/install-test-deps.sh puts it into .venv-peers/).
"""

import asyncio
import sys

import aiocoap
import aiocoap.resource as resource


class HelloWorld(resource.Resource):
    """Answers every GET with the same 11-byte text payload."""

    async def render_get(self, request):
        return aiocoap.Message(code=aiocoap.CONTENT, payload=b"hello world", content_format=0)


async def serve(host: str, port: int) -> None:
    root = resource.Site()
    root.add_resource(["benchmark"], HelloWorld())
    await aiocoap.Context.create_server_context(root, bind=(host, port))
    print(f"aiocoap benchmark server on coap://{host}:{port}/benchmark", file=sys.stderr, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    bind_host = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"
    bind_port = int(sys.argv[2]) if len(sys.argv) > 2 else 5683
    try:
        asyncio.run(serve(bind_host, bind_port))
    except KeyboardInterrupt:
        pass
