#!/usr/bin/env python3
"""A small aiocoap server that Cobalt's interop tests talk to.

Usage: aiocoap_server.py --port PORT [--bind ADDRESS] [--transports LIST]
                         [--tls-cert PEM --tls-key PEM] [--credentials JSON]

--transports: comma-separated aiocoap server transports, default "udp6". With "ws"
(CoAP over WebSockets, needs the `websockets` package, i.e. aiocoap[ws]) aiocoap
listens for WebSocket upgrades on PORT + 3000 (aiocoap's rule for an explicit bind
port), path /.well-known/coap. With "tlsserver" and --tls-cert/--tls-key it serves
coaps+tcp (ALPN coap) on PORT + 1. With --credentials (an aiocoap credentials file,
needs aiocoap[oscore]; JSON, or CBOR diagnostic notation when it ends in .diag, as
EDHOC credentials need) the resources are also served through OSCORE to the contexts
it names (":label": {"oscore": {"basedir": ...}}), and with an "edhoc-oscore" entry
EDHOC is taken at /.well-known/edhoc.

Resources:
  /hello   GET  -> 2.05 "hello from aiocoap"
  /echo    POST/PUT -> 2.04 with the request payload (and its Content-Format)
  /slow    GET  -> sleeps 3 s, so aiocoap sends an empty ACK first and then a
                   separate (CON) response "slow response"
  /large   GET  -> 3000 bytes of deterministic text (served in Block2 blocks)
  /counter GET, observable -> "count N", N increasing every 0.5 s
  /big-counter GET, observable -> 2000 bytes starting "count N", every 1 s
  /observers GET -> the number of observers of /counter, e.g. "1" (to check that a
                   client ended its relation)
  /benchmark GET -> 2.05 "hello world" (as Cobalt's /benchmark; bench/oscore.sh)
  /.well-known/core -> link-format listing of the above
"""

import argparse
import asyncio

import aiocoap
import aiocoap.resource as resource


def large_body() -> bytes:
    """3000 bytes: numbered lines 'line NNNN: abc...xyz', truncated to length."""
    out = bytearray()
    i = 0
    while len(out) < 3000:
        out += b"line %04d: abcdefghijklmnopqrstuvwxyz\n" % i
        i += 1
    return bytes(out[:3000])


class Hello(resource.Resource):
    async def render_get(self, request):
        return aiocoap.Message(
            payload=b"hello from aiocoap",
            content_format=0,
        )


class Benchmark(resource.Resource):
    async def render_get(self, request):
        return aiocoap.Message(payload=b"hello world", content_format=0)


class Echo(resource.Resource):
    async def _echo(self, request):
        msg = aiocoap.Message(code=aiocoap.CHANGED, payload=request.payload)
        if request.opt.content_format is not None:
            msg.opt.content_format = request.opt.content_format
        return msg

    async def render_post(self, request):
        return await self._echo(request)

    async def render_put(self, request):
        return await self._echo(request)


class Slow(resource.Resource):
    async def render_get(self, request):
        await asyncio.sleep(3)
        return aiocoap.Message(payload=b"slow response", content_format=0)


class Large(resource.Resource):
    async def render_get(self, request):
        return aiocoap.Message(payload=large_body(), content_format=0)


class Counter(resource.ObservableResource):
    """Observable: the payload changes every `period` seconds."""

    def __init__(self, period: float, size: int = 0):
        super().__init__()
        self.count = 0
        self.size = size
        self.period = period
        self.task = None
        self.observers = 0

    def update_observation_count(self, count):
        self.observers = count
        if count and self.task is None:
            self.task = asyncio.get_running_loop().create_task(self.tick())
        elif not count and self.task is not None:
            self.task.cancel()
            self.task = None

    async def tick(self):
        while True:
            await asyncio.sleep(self.period)
            self.count += 1
            self.updated_state()

    def body(self) -> bytes:
        text = b"count %d" % self.count
        if self.size:
            text = (text + b" " + b"x" * self.size)[: self.size]
        return text

    async def render_get(self, request):
        return aiocoap.Message(payload=self.body(), content_format=0)


class Observers(resource.Resource):
    """How many observers a Counter has."""

    def __init__(self, counter: Counter):
        super().__init__()
        self.counter = counter

    async def render_get(self, request):
        return aiocoap.Message(payload=b"%d" % self.counter.observers, content_format=0)


def load_credentials(path: str) -> dict:
    """An aiocoap credentials file as a dict: JSON, or EDN (CBOR diagnostic notation,
    for the integer keys and byte strings of EDHOC credentials) if it ends in .diag."""
    with open(path) as f:
        text = f.read()
    if path.endswith(".diag"):
        import cbor2
        import cbor_diag

        return cbor2.loads(cbor_diag.diag2cbor(text))
    import json

    return json.loads(text)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--transports", default="udp6")
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    parser.add_argument("--credentials")
    args = parser.parse_args()

    ssl_context = None
    if args.tls_cert:
        import ssl

        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_context.load_cert_chain(certfile=args.tls_cert, keyfile=args.tls_key)
        ssl_context.set_alpn_protocols(["coap"])

    site = resource.Site()
    site.add_resource(
        [".well-known", "core"],
        resource.WKCResource(site.get_resources_as_linkheader),
    )
    site.add_resource(["hello"], Hello())
    site.add_resource(["benchmark"], Benchmark())
    site.add_resource(["echo"], Echo())
    site.add_resource(["slow"], Slow())
    site.add_resource(["large"], Large())
    counter = Counter(0.5)
    site.add_resource(["counter"], counter)
    site.add_resource(["observers"], Observers(counter))
    site.add_resource(["big-counter"], Counter(1.0, size=2000))

    server_credentials = None
    if args.credentials:
        from aiocoap.credentials import CredentialsMap
        from aiocoap.oscore_sitewrapper import OscoreSiteWrapper

        server_credentials = CredentialsMap()
        server_credentials.load_from_dict(load_credentials(args.credentials))
        site = OscoreSiteWrapper(site, server_credentials)

    await aiocoap.Context.create_server_context(
        site,
        bind=(args.bind, args.port),
        transports=args.transports.split(","),
        _ssl_context=ssl_context,
        server_credentials=server_credentials,
    )
    print(
        f"aiocoap server listening on {args.bind}:{args.port} ({args.transports})",
        flush=True,
    )
    await asyncio.get_running_loop().create_future()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
