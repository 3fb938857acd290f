"""Registers at a resource directory with aiocoap's RD client (the Registerer of
aiocoap.resourcedirectory.client.register), as the Cobalt RD interop test needs it.

Serves /sensors/temp (rt=temperature) on its own context, registers it at --rd as
endpoint --ep, prints `registered <registration URI>` once the RD took it, looks up
`/rd-lookup/res?ep=<ep>` at the RD with aiocoap's client and prints `lookup <links>`,
then shuts the Registerer down (which removes the registration) and prints `removed`.

With --simple it uses simple registration instead (RFC 9176 §5.1): it POSTs
`/.well-known/rd?ep=<ep>` from its own context, prints `registered <code>`, waits until
the RD has fetched its /.well-known/core (the lookup lists the resource) and prints
`lookup <links>`.
"""

import argparse
import asyncio

import aiocoap
import aiocoap.resource as resource
from aiocoap.resourcedirectory.client.register import Registerer


class Temperature(resource.Resource):
    rt = "temperature"

    async def render_get(self, request):
        return aiocoap.Message(payload=b"21.5")


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rd", required=True, help="coap://host:port of the RD")
    parser.add_argument("--ep", required=True)
    parser.add_argument("--simple", action="store_true")
    args = parser.parse_args()

    site = resource.Site()
    site.add_resource(
        [".well-known", "core"],
        resource.WKCResource(site.get_resources_as_linkheader),
    )
    site.add_resource(["sensors", "temp"], Temperature())
    context = await aiocoap.Context.create_server_context(site, bind=("127.0.0.1", 0))

    if args.simple:
        await simple_registration(context, args)
        await context.shutdown()
        return

    registerer = Registerer(
        context, rd=args.rd, lt=300, registration_parameters={"ep": args.ep}
    )
    for _ in range(200):
        if registerer.state == "registered":
            break
        if registerer.state == "failed":
            raise SystemExit("registration failed")
        await asyncio.sleep(0.05)
    else:
        raise SystemExit("not registered after 10 s: state %s" % registerer.state)
    print("registered", registerer._registration_resource, flush=True)

    request = aiocoap.Message(
        code=aiocoap.GET, uri=args.rd + "/rd-lookup/res?ep=" + args.ep
    )
    response = await context.request(request).response
    print("lookup", response.code, response.payload.decode(), flush=True)

    await registerer.shutdown()
    print("removed", flush=True)
    await context.shutdown()


async def simple_registration(context, args):
    request = aiocoap.Message(
        code=aiocoap.POST, uri=args.rd + "/.well-known/rd?ep=" + args.ep + "&lt=300"
    )
    response = await context.request(request).response
    print("registered", response.code, flush=True)
    lookup = args.rd + "/rd-lookup/res?ep=" + args.ep
    for _ in range(200):
        response = await context.request(aiocoap.Message(code=aiocoap.GET, uri=lookup)).response
        if response.payload:
            print("lookup", response.code, response.payload.decode(), flush=True)
            return
        await asyncio.sleep(0.05)
    raise SystemExit("the RD did not register the endpoint within 10 s")


asyncio.run(main())
