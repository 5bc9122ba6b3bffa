"""Promise (send_job docstring, docs/dispatch.md): every cost is checked before the first send; a
junk cost is one CostTableError naming the message (its index and key).

Steps: send_job / job_costs with cost=lambda m: 10**5000 (an int too large for a float); the same
int as a CostTable entry and as a learn_costs sample.

Expected: CostTableError "message 0 (key 'a'): cost ... is too large".
Actual: ValueError "Exceeds the limit (4300 digits) for integer string conversion" — the error
message's own repr of the value raises — naming neither the message nor the cost.
"""
from tracer.dispatch.cost import job_costs
from tracer.dispatch.costtable import CostTable, CostTableError, learn_costs
from tracer.embedded import Message

m = Message()
m.keys = "a"
for what, call in (("job_costs", lambda: job_costs([m], lambda _m: 10**5000)),
                   ("CostTable", lambda: CostTable({"a": 10**5000})),
                   ("learn_costs", lambda: learn_costs([("a", 10**5000)]))):
    try:
        call()
    except CostTableError as exc:
        print(what, "refused:", str(exc)[:120])
        assert "too large" in str(exc), exc
        continue
    except ValueError as exc:
        raise SystemExit(f"{what}: a bare ValueError, not the CostTableError: {str(exc)[:100]}") from None
    raise SystemExit(f"{what}: 10**5000 taken as a cost")
