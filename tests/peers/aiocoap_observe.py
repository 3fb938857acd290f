#!/usr/bin/env python3
"""Observes a CoAP resource with aiocoap, prints COUNT notifications (one per line,
as "OBSERVE<TAB>PAYLOAD"), then cancels the observation and exits.

Usage: aiocoap_observe.py URI COUNT [CREDENTIALS]

With CREDENTIALS (an aiocoap credentials file, needs aiocoap[oscore]; JSON, or CBOR
diagnostic notation when it ends in .diag, as EDHOC credentials need) the requests
to the URIs it names are protected with OSCORE.
"""

import asyncio
import sys

import aiocoap


async def main(uri: str, count: int, credentials: str | None) -> int:
    ctx = await aiocoap.Context.create_client_context()
    if credentials:
        from aiocoap_server import load_credentials

        ctx.client_credentials.load_from_dict(load_credentials(credentials))
    request = aiocoap.Message(code=aiocoap.GET, uri=uri, observe=0)
    req = ctx.request(request)
    first = await asyncio.wait_for(req.response, 15)
    print(f"{first.opt.observe}\t{first.payload.decode(errors='replace')}", flush=True)
    seen = 1
    async for note in req.observation:
        if seen >= count:
            break
        print(f"{note.opt.observe}\t{note.payload.decode(errors='replace')}", flush=True)
        seen += 1
    req.observation.cancel()
    await asyncio.sleep(0.5)
    await ctx.shutdown()
    return 0 if seen >= count else 1


if __name__ == "__main__":
    credentials = sys.argv[3] if len(sys.argv) > 3 else None
    sys.exit(asyncio.run(asyncio.wait_for(main(sys.argv[1], int(sys.argv[2]), credentials), 25)))
