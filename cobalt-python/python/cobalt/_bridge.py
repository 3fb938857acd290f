"""Each asyncio event loop's inbox: where Cobalt's threads leave answers,
notifications and requests for Python handlers, and the loop picks them up.

The native side never runs Python on its own threads: it queues an event and rings
a doorbell, a descriptor that the loop watches (``loop.add_reader``); the loop then
takes everything queued at once. Calls wait on futures keyed by a token; requests for
handlers go to the handler registered under their number.

A handler's coroutine runs at once, in the batch that brought its request, up to its
first suspension: one that never waits is answered without a task or a turn of the
loop, and the batch's answers go back together when the batch is done. Only a handler
that waits becomes a task (on Python 3.12+ an eager task; before, the coroutine is
carried on by a task from where it suspended, see ``_carry_on``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
import logging
import sys
import types
import weakref
from typing import Any, Callable, Dict, Generator, Optional, Tuple

from . import _cobalt
from ._errors import ResponseError
from ._message import Code, Request, Response, answer_of

log = logging.getLogger("cobalt")

#: Tasks can start eagerly (Python 3.12+).
_EAGER = sys.version_info >= (3, 12)

#: A native coroutine (``async def``): the usual result of a handler.
_COROUTINE = types.CoroutineType

#: A context for a handler's first step, as a task would make (looked up once).
_copy_context = contextvars.copy_context

#: Handler numbers, unique over all loops (never reused).
_handler_numbers = itertools.count(1)


class Bridge:
    """One event loop's inbox, its calls waiting for answers and its handlers."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak: the bridges are kept by their loop (a WeakKeyDictionary), and end with it.
        self._loop = weakref.ref(loop)
        self.inbox = _cobalt.Inbox()
        self._tokens = itertools.count(1)
        self._waiting: Dict[int, asyncio.Future] = {}
        self.handlers: Dict[int, Callable[[Request], Any]] = {}
        #: Handler tasks in progress, with their handler's number (the loop keeps
        #: only weak references to tasks).
        self._tasks: Dict["asyncio.Future[None]", int] = {}
        loop.add_reader(self.inbox.fileno(), self._drain)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop this bridge serves."""
        loop = self._loop()
        if loop is None:
            raise RuntimeError("the event loop of this call or server is gone")
        return loop

    def expect(self) -> Tuple[int, asyncio.Future]:
        """A token for a native call and the future its event settles."""
        token = next(self._tokens)
        future = self.loop.create_future()
        self._waiting[token] = future
        return token, future

    def forget(self, token: int) -> None:
        """Stops waiting for ``token`` (its call was cancelled)."""
        self._waiting.pop(token, None)

    def add_handler(self, handler: Callable[[Request], Any]) -> int:
        """Registers ``handler``; returns its number for the native server."""
        number = next(_handler_numbers)
        self.handlers[number] = handler
        return number

    def remove_handlers(self, numbers: "set[int]") -> None:
        """Unregisters handlers and cancels their tasks still running (their server
        has shut down and answered their requests 5.03)."""
        for n in numbers:
            self.handlers.pop(n, None)
        for task, n in list(self._tasks.items()):
            if n in numbers:
                task.cancel()

    def close(self) -> None:
        """Stops watching the inbox and drops what comes to it (the loop is closing)."""
        loop = self._loop()
        try:
            if loop is not None:
                loop.remove_reader(self.inbox.fileno())
        except (RuntimeError, ValueError):  # the loop is already closed
            pass
        self.inbox.close()

    def _drain(self) -> None:
        inbox = self.inbox
        try:
            for event in inbox.drain():
                if type(event) is not tuple:
                    self._serve(event)
                    continue
                _, ident, value, error = event
                future = self._waiting.pop(ident, None)
                if future is not None and not future.done():
                    future.set_result((value, error))
        finally:
            # The answers given meanwhile go back now, together.
            inbox.release()

    def _serve(self, native: Any) -> None:
        request = Request(native)
        number = native.handler
        handler = self.handlers.get(number)
        if handler is None:
            native.respond(int(Code.SERVICE_UNAVAILABLE), b"the resource's server is shutting down")
            return
        try:
            result = handler(request)
        except BaseException as e:  # noqa: BLE001 - a failing handler is answered, not fatal
            _answer_error(request, e)
            return
        if type(result) is _COROUTINE or asyncio.iscoroutine(result):
            task = self._start(request, result)
            if task is None:
                return
        elif isinstance(result, asyncio.Future):
            task = result
        else:
            _answer(request, result)
            return
        self._tasks[task] = number
        task.add_done_callback(functools.partial(self._settle_task, request))

    def _start(self, request: Request, coro: Any) -> "Optional[asyncio.Future[Any]]":
        """Runs a handler's coroutine up to its first suspension: answers it if it
        ended there, else returns the task that carries it on."""
        if _EAGER:
            task = asyncio.Task(coro, loop=self.loop, eager_start=True)
            if task.done():
                _settle(request, task)
                return None
            return task
        # Before 3.12: the first step runs here, in a context of its own as a task's
        # would be, and the task that carries on (if it must) gets that context.
        context = _copy_context()
        try:
            suspended_on = context.run(coro.send, None)
        except StopIteration as done:
            _answer(request, done.value)
            return None
        except BaseException as e:  # noqa: BLE001 - as a task would, answer and go on
            _answer_error(request, e)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            return None
        return context.run(self.loop.create_task, _carry_on(coro, suspended_on))

    def _settle_task(self, request: Request, task: "asyncio.Future[Any]") -> None:
        self._tasks.pop(task, None)
        _settle(request, task)


async def _carry_on(coro: Any, suspended_on: Any) -> Any:
    """The rest of a coroutine that has run up to its first suspension, as a
    coroutine for a task. (A task cancelled before its first step never starts
    this: the handler's coroutine is then closed when the task is dropped.)"""
    return await _resume(coro, suspended_on)


@types.coroutine
def _resume(coro: Any, suspended_on: Any) -> Generator[Any, Any, Any]:
    """Hands the task what the coroutine suspended on (a future to wait for, or None
    to yield a turn), then passes what the task sends or throws in (a cancellation)
    to the coroutine, up to its end."""
    waiting_for = suspended_on
    while True:
        try:
            sent = yield waiting_for
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as e:  # noqa: BLE001 - cancellation and the like, passed on
            try:
                waiting_for = coro.throw(e)
            except StopIteration as done:
                return done.value
        else:
            try:
                waiting_for = coro.send(sent)
            except StopIteration as done:
                return done.value


def _settle(request: Request, task: "asyncio.Future[Any]") -> None:
    """Answers with what a handler's task ended with."""
    if task.cancelled():
        request._native.respond(int(Code.SERVICE_UNAVAILABLE), b"the handler was cancelled")
        return
    error = task.exception()
    if error is not None:
        _answer_error(request, error)
    else:
        _answer(request, task.result())


def _answer(request: Request, result: Any) -> None:
    if type(result) is Response:
        response = result
    else:
        try:
            response = answer_of(result, request._native.method)
        except (TypeError, ValueError) as e:
            _answer_error(request, e)
            return
    request._native.respond(response.code, response.payload, response.options)


def _answer_error(request: Request, error: BaseException) -> None:
    if isinstance(error, ResponseError):
        request._native.respond(int(error.code), error.message.encode())
        return
    if isinstance(error, asyncio.CancelledError):
        request._native.respond(int(Code.SERVICE_UNAVAILABLE), b"the handler was cancelled")
        return
    log.error("handler for %s %s failed", request.method.name, request.path, exc_info=error)
    request._native.respond(int(Code.INTERNAL_SERVER_ERROR), f"the handler failed: {type(error).__name__}".encode())


_bridges: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Bridge]" = weakref.WeakKeyDictionary()


def bridge(loop: Optional[asyncio.AbstractEventLoop] = None) -> Bridge:
    """The running (or given) loop's bridge, made on first use."""
    loop = loop or asyncio.get_running_loop()
    b = _bridges.get(loop)
    if b is None:
        b = _bridges[loop] = Bridge(loop)
    return b


def forget_all() -> None:
    """Forgets every loop's bridge (at shutdown)."""
    for b in list(_bridges.values()):
        b.close()
    _bridges.clear()


async def wait(token: int, future: asyncio.Future, call: Any) -> Tuple[Any, Any]:
    """Waits for a native call's event; cancelling the wait abandons the call."""
    try:
        return await future
    except asyncio.CancelledError:
        call.cancel()
        bridge().forget(token)
        raise
