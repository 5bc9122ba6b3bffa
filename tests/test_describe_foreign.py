"""Every function that reads a MessageInfo off a client's message object promises "never raises":
a foreign object whose attributes answer anything (a __str__, __bool__, __len__, __int__ or
__iter__ that raises, a property that raises) gives an empty field, not an exception. One test,
over every such reader the package ships (found by name, so a new one is covered)."""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable

import pytest

import tracer
from tracer.path.message import MessageInfo


def _readers() -> list[tuple[str, Callable[[Any], MessageInfo]]]:
    found = []
    for mod in pkgutil.walk_packages(tracer.__path__, "tracer."):
        if ".tools" in mod.name or mod.name.endswith("__main__"):
            continue
        m = importlib.import_module(mod.name)
        for name in ("describe", "describe_legacy"):
            f = getattr(m, name, None)
            if callable(f) and getattr(f, "__module__", None) == mod.name:
                found.append((f"{mod.name}.{name}", f))
    return found


READERS = _readers()


class Hostile:
    """A value every conversion of which raises."""

    def __str__(self) -> str:
        raise RuntimeError("__str__")

    __repr__ = __str__

    def __bool__(self) -> bool:
        raise RuntimeError("__bool__")

    def __len__(self) -> int:
        raise RuntimeError("__len__")

    def __int__(self) -> int:
        raise RuntimeError("__int__")

    def __iter__(self) -> Any:
        raise RuntimeError("__iter__")

    def __gt__(self, other: Any) -> bool:
        raise RuntimeError("__gt__")

    def decode(self, *a: Any) -> str:
        raise RuntimeError("decode")


class HostileMessage:
    """Every attribute a reader may ask for is hostile; get_property too."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "get_property":
            return lambda key: Hostile()
        return Hostile()


class RaisingMessage:
    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"property {name}")


def test_the_readers_are_found() -> None:
    assert {"tracer.path.message.describe", "tracer.clients.legacy.describe_legacy"} <= {n for n, _ in READERS}


@pytest.mark.parametrize("reader", [f for _, f in READERS], ids=[n for n, _ in READERS])
@pytest.mark.parametrize("msg", [HostileMessage(), RaisingMessage(), object(), None], ids=["hostile-values",
                                                                                     "raising-properties",
                                                                                     "bare-object", "none"])
def test_a_foreign_message_never_makes_a_reader_raise(reader: Callable[[Any], MessageInfo], msg: Any) -> None:
    info = reader(msg)
    assert isinstance(info, MessageInfo)
    assert isinstance(info.topic, str)
    assert all(isinstance(k, str) for k in info.keys)
