"""What a number a user hands rmqtrace must be, and the one-line refusal of one that cannot work.

Every public numeric parameter goes through one of three checks, at the call that takes it
(``tests/test_numeric_bounds.py`` finds the parameters and proves it):

* :func:`timeout_s` — how long a call may wait (``stop(timeout=)``, ``stop_timeout=``,
  ``handler_timeout=``, a dispatcher's ``close(timeout=)`` …). ``None``, ``math.inf`` and anything
  from :data:`NO_BOUND_S` up mean *no bound*: ``threading``'s waits raise ``OverflowError`` past
  ``threading.TIMEOUT_MAX`` (292 years), so a finite 1e10 that was accepted would fail deep in a
  shutdown; half of it leaves room for the slack a caller adds to a wait. NaN is refused (every
  comparison with it is false: a wait that never ends), and so is a negative one, unless the
  call documents it as "do not wait".
* :func:`count` — a number of things (threads, messages, a buffer): an ``int``, never a
  ``bool``, a float (``1.5`` threads, ``nan`` messages) or a number past what one process can run.
* :func:`seconds` — a duration that is not a wait (a lease, a margin): a finite real number in a
  range, returned as a float (an int too large for a float is refused, not an ``OverflowError``).

Each raises ``ValueError`` (``TypeError`` for something that is not a number at all) with one
line naming the parameter.
"""

from __future__ import annotations

import math
import numbers
import threading
from typing import cast

__all__ = ["MAX_THREADS", "NO_BOUND_S", "count", "seconds", "timeout_s"]

NO_BOUND_S = threading.TIMEOUT_MAX / 2  # a wait this long or longer is no bound (see the module docstring)
MAX_THREADS = 10_000  # past this a process cannot start the threads (each reserves its own stack)


def _real(value: object, what: str, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number of {unit}, got {type(value).__name__}")


def _is_nan(value: float) -> bool:
    return isinstance(value, float) and math.isnan(value)  # an int (however large) is never NaN


def timeout_s(value: object, what: str, *, negative_waits: bool = False, positive: bool = False) -> float | None:
    """``value`` as a wait in seconds: a float in ``[0, NO_BOUND_S)``, or None for no bound.

    ``negative_waits``: a negative timeout means "do not wait" (0.0) instead of an error;
    ``positive``: 0 is refused too (a limit nothing could meet, e.g. ``handler_timeout=0``).

    Raises:
        TypeError: not a number (nor None).
        ValueError: NaN; negative unless ``negative_waits``; 0 when ``positive``.
    """
    if value is None:
        return None
    _real(value, what, "seconds")
    value = cast(float, value)  # an int, a float, or another numbers.Real: compared exactly, never converted
    if _is_nan(value) or (value < 0 and not negative_waits) or (positive and value <= 0):
        allowed = "a number > 0" if positive else "a number" if negative_waits else "a number >= 0"
        raise ValueError(f"{what} must be {allowed} of seconds (None or math.inf: no bound), got {value!r}")
    if value >= NO_BOUND_S:  # exact for any int and for inf: nothing is converted first
        return None
    return max(0.0, float(value))


def count(value: object, what: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as a count: an ``int`` in ``[minimum, maximum]``.

    Raises:
        ValueError: a bool, a float (even a whole one: ``2.0`` threads is a unit mistake), NaN,
            or outside the range.
        TypeError: not a number at all.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real):  # a bool too: True threads is a mistake, not a count
            raise ValueError(f"{what} must be a whole number (an int), got {value!r}")
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    n = int(value)
    if n < minimum or (maximum is not None and n > maximum):
        top = "" if maximum is None else f" and <= {maximum}"
        shown = n if n.bit_length() < 64 else "a huge int"  # repr of 10**5000 itself raises
        raise ValueError(f"{what} must be an int >= {minimum}{top}, got {shown}")
    return n


def seconds(value: object, what: str, *, minimum: float = 0.0, above: bool = True,
            maximum: float | None = None) -> float:
    """``value`` as a finite duration in seconds: ``> minimum`` (``>=`` when ``above`` is False),
    ``<= maximum``; returned as a float.

    Raises:
        ValueError: NaN, an infinity, one too large for a float, or outside the range.
        TypeError: not a number.
    """
    _real(value, what, "seconds")
    value = cast(float, value)
    low = minimum < value if above else minimum <= value
    high = maximum is None or value <= maximum
    finite = not _is_nan(value) and abs(value) < math.inf and abs(value) <= 1e300  # also an int past a float
    if not (finite and low and high):
        bound = f"{'>' if above else '>='} {minimum:g}" + ("" if maximum is None else f" and <= {maximum:g}")
        shown = repr(value) if not isinstance(value, int) or value.bit_length() < 64 else "a huge int"
        raise ValueError(f"{what} must be a finite number of seconds {bound}, got {shown}")
    return float(value)
