#!/usr/bin/env python3
"""aiocoap server with /benchmark -> "hello world", for bench/compare.sh.

Usage: aiocoap_benchmark.py PORT
"""
import asyncio
import sys

import aiocoap
import aiocoap.resource as resource


class Benchmark(resource.Resource):
    async def render_get(self, request):
        return aiocoap.Message(payload=b"hello world", content_format=0)


async def main(port: int) -> None:
    site = resource.Site()
    site.add_resource(["benchmark"], Benchmark())
    await aiocoap.Context.create_server_context(site, bind=("127.0.0.1", port), transports=["udp6"])
    await asyncio.get_running_loop().create_future()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
