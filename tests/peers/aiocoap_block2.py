#!/usr/bin/env python3
"""GETs a resource with aiocoap asking for Block2 blocks of SIZE bytes from the first
request on (early negotiation, RFC 7959 §2.4), lets aiocoap fetch the rest, and prints
one line per block after the first as aiocoap logs it ("BLOCK<TAB>NUM<TAB>MORE<TAB>SZX"),
then "DONE<TAB>CODE<TAB>LENGTH".

Usage: aiocoap_block2.py URI SIZE
"""

import asyncio
import logging
import sys

import aiocoap
from aiocoap.optiontypes import BlockOption


class Blocks(logging.Handler):
    """Collects aiocoap's debug line for every Block2 response after the first."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.seen = []

    def emit(self, record):
        if record.getMessage().startswith("Response with Block2 option received"):
            self.seen.append(record.args)


async def main(uri: str, size: int) -> int:
    blocks = Blocks()
    logging.getLogger().addHandler(blocks)
    logging.getLogger().setLevel(logging.DEBUG)
    ctx = await aiocoap.Context.create_client_context()
    request = aiocoap.Message(code=aiocoap.GET, uri=uri)
    request.opt.block2 = BlockOption.BlockwiseTuple(0, False, size.bit_length() - 5)
    response = await asyncio.wait_for(ctx.request(request).response, 20)
    for num, more, szx in blocks.seen:
        print(f"BLOCK\t{num}\t{more}\t{szx}", flush=True)
    print(f"DONE\t{response.code.dotted}\t{len(response.payload)}", flush=True)
    await ctx.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(asyncio.wait_for(main(sys.argv[1], int(sys.argv[2])), 25)))
