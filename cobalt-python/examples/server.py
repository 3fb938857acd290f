"""A CoAP server in Python on Cobalt: a greeting, an echo, a temperature that clients
can observe (it changes every 2 s), and items with a path parameter.

    python examples/server.py [--port 5683] [--config cobalt.toml] [--tcp]

then, e.g., `python examples/client.py coap://127.0.0.1/temp --observe` or
`coap-client -m get -s 10 coap://127.0.0.1/temp`.
"""

import argparse
import asyncio
import random

import cobalt

site = cobalt.Site()
temperature = 21.5


@site.route("/hello", rt="greeting", ct=cobalt.ContentFormat.TEXT)
async def hello(request: cobalt.Request) -> str:
    return f"hello {request.query_param('name') or 'world'}"


@site.route("/echo", methods=["POST", "PUT"])
async def echo(request: cobalt.Request) -> cobalt.Response:
    return cobalt.Response(cobalt.Code.CHANGED, request.payload, content_format=request.content_format)


@site.route("/temp", observable=True, rt="temperature", ct=cobalt.ContentFormat.TEXT)
async def temp(request: cobalt.Request) -> str:
    return f"{temperature:.1f}"


@site.route("/items/{id}")
class Item:
    """A class resource: its methods handle GET and PUT."""

    def __init__(self) -> None:
        self.items: dict = {}

    async def get(self, request: cobalt.Request) -> dict:
        item_id = request.params["id"]
        if item_id not in self.items:
            raise cobalt.ResponseError(cobalt.Code.NOT_FOUND, f"no item {item_id}; PUT one first")
        return {"id": item_id, "value": self.items[item_id]}

    async def put(self, request: cobalt.Request) -> cobalt.Code:
        created = request.params["id"] not in self.items
        self.items[request.params["id"]] = request.text
        return cobalt.Code.CREATED if created else cobalt.Code.CHANGED


async def weather() -> None:
    global temperature
    while True:
        await asyncio.sleep(2)
        temperature += random.uniform(-0.5, 0.5)
        temp.changed()  # every observer gets the GET handler's new answer


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=None, help="address to bind (default: the config's, [::])")
    parser.add_argument("--port", type=int, default=None, help="UDP port (default: the config's, 5683)")
    parser.add_argument("--config", default=None, help="the TOML file `cobalt serve --config` reads")
    parser.add_argument("--tcp", action="store_true", help="also serve coap+tcp on port 5683")
    args = parser.parse_args()
    server = await site.start(args.host, args.port, config=args.config, tcp=True if args.tcp else None)
    for scheme, (host, port) in server.addresses.items():
        print(f"serving {scheme} on {host}:{port}")
    ticker = asyncio.ensure_future(weather())
    try:
        await asyncio.Event().wait()
    finally:
        ticker.cancel()
        await server.shutdown()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
