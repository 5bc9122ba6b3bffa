"""What kind of callable a user handed us, and the one-line refusal of one that cannot work.

Calling an ``async def`` (or a generator function) like a function only builds a coroutine (or a
generator): a handler would "succeed" without running, a listener's message would fail for ever,
an ``until=`` would be true at once. Every seam that takes a user's callable checks it here,
before anything starts (``tests/test_user_callables.py`` finds the seams).

The check of the kind cannot see a plain callable that *returns* a coroutine (a decorator without
``functools.wraps``, ``lambda m: handle_async(m)``): every seam that runs a user's per-message
callable also looks at what it returned (:func:`never_ran`) and fails that message with
:class:`HandlerNeverRan` instead of counting it a success (``tests/test_user_callables.py`` again).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["HandlerNeverRan", "exact_str", "holds", "never_ran", "require_async", "require_plain", "short_repr", "unrun"]


def _kind(fn: Callable[..., Any]) -> str:
    """``"async"``, ``"generator"`` or ``"plain"``: what calling ``fn`` gives (``__wrapped__`` followed)."""
    for f in (fn, inspect.unwrap(fn), getattr(type(fn), "__call__", None)):  # noqa: B004 - an object's __call__
        if f is None:
            continue
        if inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f):
            return "async"
        if inspect.isgeneratorfunction(f):
            return "generator"
    return "plain"


class HandlerNeverRan(TypeError):
    """A plain handler (listener, callback) returned a coroutine, another awaitable or a generator:
    its body never ran, so the message failed (it is never acked)."""


def never_ran(result: object, what: str) -> HandlerNeverRan | None:
    """The failure for a ``result`` that means the callable's body never ran, else None.

    A coroutine or generator is closed here, so Python does not warn "never awaited" and nothing
    of it runs later; another awaitable (a Future, a Task) is left alone — it is not ours to stop.
    """
    kind = unrun(result)
    if kind is None:
        return None
    return HandlerNeverRan(f"{what} returned {kind} instead of running, so the message failed: use an "
                           "async def handler with the asyncio engine (AsyncDispatcher), or await it "
                           "inside an async def handler; a generator handler must return, not yield")


def unrun(result: object) -> str | None:
    """What ``result`` is ("a coroutine", "a generator" …) when it means the callable's body never
    ran, else None: the one test every seam applies to what a user's callable returned.

    A coroutine or generator is closed here, so Python does not warn "never awaited" and nothing
    of it runs later; another awaitable (a Future, a Task) is left alone — it is not ours to stop.
    """
    if result is None or isinstance(result, (str, bytes, int, float)):  # the common answers, at no cost
        return None
    if inspect.iscoroutine(result) or inspect.isgenerator(result):
        kind = "a coroutine" if inspect.iscoroutine(result) else "a generator"
        result.close()
        return kind
    if inspect.isasyncgen(result):
        return "an async generator"  # never started: nothing to close, nothing to warn
    if inspect.isawaitable(result):
        return f"an awaitable ({type(result).__name__})"
    return None


def holds(predicate: Callable[[Any], object], value: object, what: str) -> bool:
    """``predicate(value)`` as a bool, for a predicate the caller waits on (``until=``, ``wait()``).

    A coroutine is truthy: taken as it is, a wait would end at once on a check that never ran.

    Raises:
        TypeError: the predicate returned a coroutine, an awaitable or a generator (closed first).
    """
    result = predicate(value)
    kind = unrun(result)
    if kind is not None:
        raise TypeError(f"{what} returned {kind} instead of a bool: its check never ran; "
                        "make it a plain function that returns a bool")
    return bool(result)


def require_plain(fn: object, what: str, *, optional: bool = False) -> None:
    """Refuse, with one line, a callable that is not a plain function (``async def``, a generator).

    Calling one of those only builds a coroutine or a generator — it would "succeed" without
    running. ``optional``: ``None`` is allowed.

    Raises:
        TypeError: ``fn`` is not callable, or calling it would not run it.
    """
    if fn is None and optional:
        return
    if not callable(fn):
        raise TypeError(f"{what} must be callable, got {type(fn).__name__}")
    kind = _kind(fn)
    if kind != "plain":
        raise TypeError(f"{what} must be a plain function, got an {kind} function {_name(fn)}"
                        f"{'; use AsyncDispatcher for async handlers' if what == 'handler' else ''}")  # fmt: skip


def require_async(fn: object, what: str) -> None:
    """Refuse, with one line, a callable that is not an ``async def`` function (or has no async ``__call__``).

    A plain function would run on the event loop and block it.

    Raises:
        TypeError: ``fn`` is not callable or not an ``async def`` function.
    """
    if not callable(fn):
        raise TypeError(f"{what} must be callable, got {type(fn).__name__}")
    kind = _kind(fn)
    if kind != "async" or inspect.isasyncgenfunction(inspect.unwrap(fn)):
        got = "an async generator" if kind == "async" else f"a {kind}"
        raise TypeError(f"{what} must be an async def function, got {got} function {_name(fn)}"
                        f"{'; use Dispatcher for plain handlers' if what == 'handler' else ''}")  # fmt: skip


def exact_str(k: str) -> str:
    """A ``key=`` answer as rmqtrace keeps it: a ``str`` subclass copied to a plain ``str`` (its own
    ``__hash__``/``__eq__``, which may raise or disagree with ``str``'s, never run on our side)."""
    return k if type(k) is str else str.__str__(k)


def _name(fn: object) -> str:
    return repr(getattr(fn, "__qualname__", type(fn).__name__))


def short_repr(v: object) -> str:
    """``repr(v)`` cut to 80 characters, for an error or a log line about what a user's callable
    answered; never raises (an int of 5000 digits refuses ``repr``, a user's ``__repr__`` may raise)."""
    try:
        r = repr(v)
    except Exception:  # noqa: BLE001 - only for a message
        r = f"<{type(v).__name__}>"
    return r if len(r) <= 80 else r[:77] + "..."
