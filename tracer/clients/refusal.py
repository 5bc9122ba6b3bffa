"""What a refused settle or renewal says: whether the delivery's lease was already gone.

The proxy refuses an ``ack``, ``change_invisible_duration`` or renewal whose receipt handle's
invisible time has passed with ``apache.rocketmq.v2.Code.INVALID_RECEIPT_HANDLE`` (40013,
"receipt handle is expired"; the 5.x client raises it as ``BadRequestException`` with that
``code``, the embedded broker as ``EmbeddedBrokerError``): the broker hands the message out again,
so it may run twice — a lost lease, on every seam that sees the refusal.
"""

from __future__ import annotations

__all__ = ["HANDLE_EXPIRED", "lease_gone"]

HANDLE_EXPIRED = 40013


def lease_gone(exc: BaseException | None) -> bool:
    """Whether a refused ack, nack or renewal (``exc``, the call's exception) says the delivery's
    lease was already gone."""
    code = getattr(exc, "code", None)
    try:
        return code is not None and int(code) == HANDLE_EXPIRED
    except (TypeError, ValueError):
        return False
