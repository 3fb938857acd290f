"""How handlers run: a coroutine runs at once up to its first suspension (answered
there if it ends), then a task carries it on; the answers of a batch of requests go
back together. Each request's handler has a context of its own, as a task would."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Iterator

import pytest
from conftest import BackgroundServer

import cobalt
from cobalt import Code
from cobalt._bridge import _carry_on

#: What a handler of the test site saw of it before it set it.
seen: "contextvars.ContextVar[str]" = contextvars.ContextVar("seen")


def make_site() -> cobalt.Site:
    site = cobalt.Site()

    @site.route("/at-once")
    async def at_once(request: cobalt.Request) -> str:
        return f"at once {request.query_param('n')}"

    @site.route("/suspends")
    async def suspends(request: cobalt.Request) -> str:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0)  # a bare yield to the loop
        later = loop.create_future()
        loop.call_later(0.01, later.set_result, "later")
        got = await later  # a future to wait for
        await asyncio.sleep(0.001)
        return f"{got} {request.query_param('n')}"

    @site.route("/fails")
    async def fails(request: cobalt.Request) -> str:
        if request.query_param("after") is not None:
            await asyncio.sleep(0)
        if request.query_param("how") == "refuse":
            raise cobalt.ResponseError(Code.BAD_REQUEST, "refused")
        raise RuntimeError("a bug")

    @site.route("/context")
    async def context(request: cobalt.Request) -> str:
        before = seen.get("unset")
        seen.set(request.query_param("n") or "")
        await asyncio.sleep(0)
        return f"{before} {seen.get()}"

    return site


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    s = BackgroundServer(make_site(), host="127.0.0.1", port=0)
    yield s
    s.stop()


def test_a_handler_that_suspends_is_carried_on_to_its_answer(server, run):
    async def main():
        r = await cobalt.get(server.uri("coap", "/suspends?n=1"))
        assert (r.code, r.text) == (Code.CONTENT, "later 1")
        assert (await cobalt.get(server.uri("coap", "/at-once?n=2"))).text == "at once 2"

    run(main())


def test_errors_before_and_after_the_first_suspension_are_answered(server, run):
    async def main():
        for after in ("", "&after"):
            r = await cobalt.get(server.uri("coap", f"/fails?how=refuse{after}"), check=False)
            assert (r.code, r.text) == (Code.BAD_REQUEST, "refused")
            r = await cobalt.get(server.uri("coap", f"/fails?how=bug{after}"), check=False)
            assert r.code == Code.INTERNAL_SERVER_ERROR and "RuntimeError" in r.text

    run(main())


def test_each_request_has_a_context_of_its_own(server, run):
    """What a handler sets in a context variable stays with its request, also across
    its suspension: neither the next request nor a concurrent one sees it."""

    async def main():
        for n in range(3):
            assert (await cobalt.get(server.uri("coap", f"/context?n={n}"))).text == f"unset {n}"
        clients = [cobalt.Client() for _ in range(20)]
        answers = await asyncio.gather(
            *(c.get(server.uri("coap", f"/context?n={i}")) for i, c in enumerate(clients))
        )
        assert [a.text for a in answers] == [f"unset {i}" for i in range(20)]

    run(main())


def test_a_burst_of_requests_is_answered_in_full(server, run):
    """Many clients at once: the server's batches mix handlers that end at once and
    ones that wait; every request gets its own answer."""

    async def one_client(c: int) -> "list[str]":
        client = cobalt.Client()
        out = []
        for i in range(10):
            path = "/suspends" if (c + i) % 3 == 0 else "/at-once"
            out.append((await client.get(server.uri("coap", f"{path}?n={c}.{i}"))).text)
        return out

    async def main():
        results = await asyncio.gather(*(one_client(c) for c in range(30)))
        for c, texts in enumerate(results):
            assert texts == [
                f"{'later' if (c + i) % 3 == 0 else 'at once'} {c}.{i}" for i in range(10)
            ]

    run(main())


def test_carry_on_passes_results_and_cancellation_through():
    """The task that carries on a started coroutine hands it what it waited for, and
    a cancellation reaches the coroutine where it waits."""

    async def main():
        loop = asyncio.get_running_loop()
        gate = loop.create_future()
        cleaned_up = []

        async def handler() -> str:
            got = await gate
            try:
                await asyncio.Event().wait()
            finally:
                cleaned_up.append(got)
            return "never"

        coro = handler()
        first = coro.send(None)
        assert first is gate  # suspended on the future it awaits
        task = loop.create_task(_carry_on(coro, first))
        await asyncio.sleep(0)
        gate.set_result("opened")
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert cleaned_up == ["opened"]

        async def answers() -> int:
            await asyncio.sleep(0)
            return 42

        coro = answers()
        task = loop.create_task(_carry_on(coro, coro.send(None)))
        assert await task == 42

    asyncio.run(main())
