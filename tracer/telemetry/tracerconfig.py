"""What the environment tells a :class:`~tracer.telemetry.tracer.MessageTracer`, read once.

:meth:`TracerConfig.from_env` is read by the constructor; the keep variables it carries are what
:meth:`~tracer.telemetry.tracer.MessageTracer.writer` applies when the provider shows up later
(``opentelemetry-instrument`` installs it after the tracer was built), so a variable changed in
between changes nothing: one reading, one configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from ..environ import environment
from ..path.names import TRACE_SHAPES

__all__ = ["TracerConfig", "keep_variables"]

_KEEP_PREFIX = "RMQTRACE_KEEP_"


def keep_variables(env: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """The ``RMQTRACE_KEEP_*`` variables of ``env`` (default: :func:`tracer.environ.environment`):
    what the keep policy and its hold are built from, one reading for both."""
    e = environment() if env is None else env
    return {k: v for k, v in e.items() if k.startswith(_KEEP_PREFIX)}


@dataclass(frozen=True, slots=True)
class TracerConfig:
    """A tracer's settings from ``RMQTRACE_TRACE_SHAPE`` and ``RMQTRACE_KEEP_*``.

    ``trace_shape``: ``full`` (process, handler and gap spans) or ``compact`` (process alone, every
    gap and stamp as its attributes), normalised (blanks and case). ``keep_env``: the
    ``RMQTRACE_KEEP_*`` variables as set, parsed by :func:`tracer.telemetry.adopt.keep_for` for
    the provider the tracer writes into (empty: no keep policy unless the provider has one).

    Raises:
        ValueError: an unknown ``trace_shape``.
    """

    trace_shape: str = "full"
    keep_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        shape = self.trace_shape.strip().lower()
        if shape not in TRACE_SHAPES:
            raise ValueError(f"trace_shape (RMQTRACE_TRACE_SHAPE) must be one of {', '.join(TRACE_SHAPES)}, "
                             f"got {shape!r}")
        object.__setattr__(self, "trace_shape", shape)  # frozen: normalised once, here
        object.__setattr__(self, "keep_env", MappingProxyType(dict(self.keep_env)))

    @property
    def compact(self) -> bool:
        return self.trace_shape == "compact"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, trace_shape: str | None = None) -> TracerConfig:
        """The configuration ``env`` (default: :func:`tracer.environ.environment`) describes;
        ``trace_shape`` given wins over ``RMQTRACE_TRACE_SHAPE``.

        Raises:
            ValueError: an unknown trace shape.
        """
        e = environment() if env is None else env
        shape = trace_shape if trace_shape is not None else (e.get("RMQTRACE_TRACE_SHAPE") or "full")
        return cls(shape, keep_variables(e))
