"""A CoAP client in Python on Cobalt.

    python examples/client.py coap://127.0.0.1/hello
    python examples/client.py coap+tcp://127.0.0.1/echo --method POST --payload hi
    python examples/client.py coap://127.0.0.1/temp --observe
    python examples/client.py coaps://127.0.0.1/hello --psk alice:secretPSK
"""

import argparse
import asyncio
import sys

import cobalt


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("uri")
    parser.add_argument("--method", default="GET")
    parser.add_argument("--payload", default=None)
    parser.add_argument("--observe", action="store_true", help="print notifications until Ctrl-C")
    parser.add_argument("--psk", default=None, help="IDENTITY:KEY for coaps:// and coaps+tcp://")
    parser.add_argument("--ca", default=None, help="PEM file of the CA that signed the server's certificate")
    args = parser.parse_args()
    psk = tuple(args.psk.split(":", 1)) if args.psk else None
    client = cobalt.Client(psk=psk, ca=args.ca)
    try:
        if args.observe:
            async with client.observe(args.uri) as observation:
                async for notification in observation:
                    print(notification.code, notification.text, flush=True)
            return 0
        response = await client.request(args.method, args.uri, args.payload)
    except cobalt.ResponseError as e:
        print(e, file=sys.stderr)
        return 1
    except cobalt.CoapError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(response.code, response.text)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except KeyboardInterrupt:
        pass
