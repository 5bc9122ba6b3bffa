"""Promise (docs/dispatch.md): `cost_aware` and send_job read the same costs; a cost is a real number
>= 0 (the dispatcher takes any numbers.Real: tracer/dispatch/core.py _as_cost).

Steps: a cost= that returns fractions.Fraction(1, 2) (or a numpy float32, any numbers.Real), given
to the dispatcher's cost= and to send_job's cost=.

Expected: both take 0.5.
Actual: the dispatcher takes 0.5; send_job refuses the whole job: "cost Fraction(1, 2) is not a
number" — a number, refused with a message that says it is not one.
"""
from fractions import Fraction

from tracer.dispatch.cost import job_costs
from tracer.dispatch.costtable import CostTableError
from tracer.embedded import Message

m = Message()
m.keys = "a"
try:
    costs = job_costs([m], lambda _m: Fraction(1, 2))
except CostTableError as exc:
    raise SystemExit(f"a real number refused: {exc}") from None
assert costs == [0.5], costs
