"""Async actions and handlers run from the SDK's plain (threaded) code."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any


def loop_running() -> bool:
    """Whether the calling thread runs an asyncio event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def is_async(fn: Any) -> bool:
    """Whether calling fn returns a coroutine by its definition: an async
    def, a functools.partial of one, or an object whose __call__ is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def await_alone(awaitable: Any, what: str) -> Any:
    """The result of an awaitable that plain code was handed, awaited on an
    event loop of its own as asyncio.run would. Raises TypeError where it
    cannot be: in a thread that runs an event loop (blocked by the caller,
    it could never finish; the coroutine is closed unawaited), or for an
    awaitable that is not a coroutine (a task or future of another loop,
    which may already be acting)."""
    if inspect.iscoroutine(awaitable):
        if not loop_running():
            return asyncio.run(awaitable)
        awaitable.close()
        raise TypeError(f"ratchet: {what} returned a coroutine in a thread that runs an event loop, where it "
                        "cannot be awaited without blocking that loop for good: nothing was reported")
    raise TypeError(f"ratchet: {what} returned {type(awaitable).__name__}, an awaitable that is not a "
                    "coroutine and belongs to another event loop: nothing was reported")
