"""The asyncio and blocking clients against a Python-defined Cobalt server, over every
scheme; the server's handlers, discovery, observe and block-wise transfers."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import PSK_IDENTITY, PSK_KEY, big_text

import cobalt
from cobalt import Code, ContentFormat

PLAIN = ["coap", "coap+tcp", "coap+ws"]
SECURE = ["coaps", "coaps+tcp", "coaps+ws"]


@pytest.mark.parametrize("scheme", PLAIN)
def test_every_method_over_the_plain_schemes(served, run, scheme):
    server, state, _ = served

    async def main():
        r = await cobalt.get(server.uri(scheme, "/hello?name=py"))
        assert (r.code, r.text, r.content_format) == (Code.CONTENT, "hello py", ContentFormat.TEXT)
        r = await cobalt.post(server.uri(scheme, "/echo"), '{"a": 1}', content_format=ContentFormat.JSON)
        assert (r.code, r.json(), r.content_format) == (Code.CHANGED, {"a": 1}, ContentFormat.JSON)
        r = await cobalt.put(server.uri(scheme, "/store"), b"\x00\x01")
        assert r.code == Code.CHANGED and state.stored == b"\x00\x01"
        assert (await cobalt.get(server.uri(scheme, "/store"))).payload == b"\x00\x01"
        r = await cobalt.fetch(server.uri(scheme, "/echo"), "query")
        assert (r.code, r.text) == (Code.CONTENT, "query")
        r = await cobalt.delete(server.uri(scheme, "/store"))
        assert r.code == Code.DELETED and state.stored == b""
        r = await cobalt.get(server.uri(scheme, "/items/42"))
        assert r.json() == {"id": "42", "peer": scheme}

    run(main())


@pytest.mark.parametrize("scheme", SECURE)
def test_secure_schemes_with_a_pre_shared_key(served_psk, run, scheme):
    server = served_psk

    async def main():
        client = cobalt.Client(psk=(PSK_IDENTITY, PSK_KEY))
        r = await client.get(server.uri(scheme, "/whoami"))
        assert r.text == PSK_IDENTITY
        r = await client.post(server.uri(scheme, "/echo"), "secret")
        assert r.text == "secret"

    run(main())


@pytest.mark.parametrize("scheme", SECURE)
def test_secure_schemes_with_certificates(served, run, pki, scheme):
    server, _, _ = served

    async def main():
        client = cobalt.Client(ca=pki["ca.pem"])
        r = await client.get(server.uri(scheme, "/hello"))
        assert r.text == "hello world"
        r = await client.get(server.uri(scheme, "/whoami"))
        assert r.text == "anonymous"

    run(main())


def test_a_wrong_key_fails_the_handshake(served_psk, run):
    server = served_psk

    async def main():
        client = cobalt.Client(psk=(PSK_IDENTITY, "not the key"))
        with pytest.raises(cobalt.HandshakeFailed):
            await client.get(server.uri("coaps", "/hello"), timeout=10)

    run(main())


@pytest.mark.parametrize("scheme", PLAIN)
def test_block_wise_both_ways(served, run, scheme):
    server, _, _ = served

    async def main():
        r = await cobalt.get(server.uri(scheme, "/big"))
        assert r.text == big_text(5000)
        body = big_text(3000).encode()
        r = await cobalt.post(server.uri(scheme, "/echo"), body, block_size=256)
        assert r.payload == body

    run(main())


@pytest.mark.parametrize("scheme", ["coap", "coap+tcp"])
def test_observe_gets_each_change_and_cancel_ends_the_relation(served, run, scheme):
    server, state, temp = served

    async def main():
        seen = []
        async with cobalt.observe(server.uri(scheme, "/temp")) as observation:
            async for n in observation:
                seen.append(n.text)
                assert n.observe is not None
                if len(seen) == 3:
                    break
                state.temperature += 1
                temp.changed()
            assert temp.observer_count == 1
            last = await observation.cancel()
            assert last is not None and last.code == Code.CONTENT
        assert [int(s) for s in seen] == [state.temperature - 2, state.temperature - 1, state.temperature]
        for _ in range(50):
            if temp.observer_count == 0:
                break
            await asyncio.sleep(0.05)
        assert temp.observer_count == 0

    run(main())


def test_a_put_handler_on_the_resource_notifies_its_observers(served, run):
    server, _, _ = served

    async def main():
        observation = cobalt.observe(server.uri("coap", "/temp"))
        await observation.__anext__()
        r = await cobalt.put(server.uri("coap", "/temp"), "-7")
        assert r.code == Code.CHANGED
        assert (await observation.__anext__()).text == "-7\n"
        await observation.cancel()

    run(main())


def test_discovery_lists_the_link_attributes(served, run):
    server, _, _ = served

    async def main():
        r = await cobalt.get(server.uri("coap", "/.well-known/core"))
        links = r.text.split(",")
        assert '</hello>;rt="greeting";ct=0' in links
        temp = next(link for link in links if link.startswith("</temp>"))
        assert 'rt="temperature"' in temp and 'if="sensor"' in temp and "obs" in temp
        assert r.content_format == ContentFormat.LINK_FORMAT

    run(main())


def test_error_answers_raise_response_error_with_the_code(served, run):
    server, _, _ = served

    async def main():
        with pytest.raises(cobalt.ResponseError) as missing:
            await cobalt.get(server.uri("coap", "/nothing-here"))
        assert missing.value.code == Code.NOT_FOUND and missing.value.response is not None
        with pytest.raises(cobalt.ResponseError) as forbidden:
            await cobalt.get(server.uri("coap", "/forbidden"))
        assert (forbidden.value.code, forbidden.value.response.text) == (Code.FORBIDDEN, "not for you")
        with pytest.raises(cobalt.ResponseError) as broken:
            await cobalt.get(server.uri("coap", "/broken"))
        assert broken.value.code == Code.INTERNAL_SERVER_ERROR
        assert "RuntimeError" in broken.value.response.text
        r = await cobalt.post(server.uri("coap", "/hello"), check=False)
        assert r.code == Code.METHOD_NOT_ALLOWED

    run(main())


def test_class_resources_keep_their_state(served, run):
    server, _, _ = served

    async def main():
        before = int((await cobalt.get(server.uri("coap", "/counter"))).text)
        r = await cobalt.post(server.uri("coap", "/counter"))
        assert (r.code, int(r.text)) == (Code.CHANGED, before + 1)

    run(main())


def test_handlers_wait_concurrently(served, run):
    """Five requests (from five clients: one client sends one at a time to a server,
    NSTART 1) are in their handler at the same time: each waits for all five."""
    server, _, _ = served

    async def main():
        uri = server.uri("coap", "/gate?n=5")
        answers = await asyncio.gather(*(cobalt.Client().get(uri) for _ in range(5)))
        assert [a.text for a in answers] == ["5"] * 5

    run(main())


def test_cancelling_a_call_abandons_it(served, run):
    server, _, _ = served

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(cobalt.get(server.uri("coap", "/slow?s=2")), 0.1)
        assert (await cobalt.get(server.uri("coap", "/hello"))).text == "hello world"

    run(main())


def test_blocking_client(served, served_psk):
    server, state, temp = served
    r = cobalt.blocking.get(server.uri("coap", "/hello?name=script"))
    assert r.text == "hello script"
    r = cobalt.blocking.post(server.uri("coap+tcp", "/echo"), "x", content_format=ContentFormat.TEXT)
    assert (r.code, r.text) == (Code.CHANGED, "x")
    client = cobalt.blocking.Client(psk=(PSK_IDENTITY, PSK_KEY))
    assert client.get(served_psk.uri("coaps", "/whoami")).text == PSK_IDENTITY
    with pytest.raises(cobalt.ResponseError) as e:
        cobalt.blocking.get(server.uri("coap", "/nothing-here"))
    assert e.value.code == Code.NOT_FOUND
    with cobalt.blocking.observe(server.uri("coap", "/temp")) as observation:
        first = next(observation)
        state.temperature += 1
        temp.changed()
        second = next(observation)
        assert int(second.text) == int(first.text) + 1
        assert observation.cancel().code == Code.CONTENT


VERBS_WITH_A_BODY = [("post", Code.CHANGED), ("put", Code.CHANGED), ("fetch", Code.CONTENT),
                     ("patch", Code.CHANGED), ("ipatch", Code.CHANGED)]


def test_the_blocking_client_has_every_verb_of_the_asyncio_one(served, run):
    server, _, _ = served
    uri = server.uri("coap", "/echo")
    for name, code in VERBS_WITH_A_BODY:
        blocking_answers = [getattr(cobalt.blocking, name)(uri, name), getattr(cobalt.blocking.Client(), name)(uri, name)]

        async def asyncio_answers():
            return [await getattr(cobalt, name)(uri, name), await getattr(cobalt.Client(), name)(uri, name)]

        for r in blocking_answers + run(asyncio_answers()):
            assert (r.code, r.text) == (code, name), name
    assert cobalt.blocking.delete(server.uri("coap", "/store")).code == Code.DELETED


def test_json_answers(served, run):
    server, _, _ = served

    async def main():
        r = await cobalt.get(server.uri("coap", "/items/a"))
        assert r.content_format == ContentFormat.JSON
        assert json.loads(r.payload) == {"id": "a", "peer": "coap"}

    run(main())


@pytest.mark.parametrize("scheme", ["coaps", "coaps+tcp"])
def test_client_certificates(pki, run, scheme):
    """A server given a CA requires client certificates and names their subject."""
    from conftest import BackgroundServer, State, make_site

    site, _ = make_site(State())
    server = BackgroundServer(
        site, host="127.0.0.1", port=0, dtls=0, tls=0,
        cert=pki["server.pem"], key=pki["server.key"], ca=pki["ca.pem"],
    )

    async def main():
        client = cobalt.Client(cert=pki["client.pem"], key=pki["client.key"], ca=pki["ca.pem"])
        r = await client.get(server.uri(scheme, "/whoami"))
        assert "client" in r.text
        with pytest.raises((cobalt.HandshakeFailed, cobalt.ConnectionFailed)):
            await cobalt.Client(ca=pki["ca.pem"]).get(server.uri(scheme, "/whoami"), timeout=10)

    try:
        run(main())
    finally:
        server.stop()
