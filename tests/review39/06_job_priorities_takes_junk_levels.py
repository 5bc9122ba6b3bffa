"""tracer.dispatch.job_priorities turns junk levels into junk priorities instead of refusing.

Promise (brief: loud early errors for junk ``priority_levels``: bool, float, huge …; the function
is public, exported by ``tracer.dispatch``, its docstring: a priority per message "falling from
``levels - 1``" for a topic of ``levels`` queues). ``send_job`` checks its ``priority_levels``
(check_priority_levels), but ``job_priorities`` itself does not: ``levels=2.5`` gives FLOAT
priorities ([1.5, 1.5, 0.5]: the embedded setter refuses them, the 5.x client's accepts and the
send fails in protobuf), ``levels=True`` is taken as 1, and ``levels=2**40`` gives priorities above
the wire's int32 (the client's send fails). Severity: low (only direct callers).
"""
from __future__ import annotations

from tracer.dispatch import job_priorities

taken = []
for levels in (2.5, True, 2**40):
    try:
        out = job_priorities([1.0, 2.0, 3.0], levels)  # type: ignore[arg-type]
        taken.append(f"levels={levels!r} -> {out}")
    except (TypeError, ValueError):
        pass
assert not taken, "\n  ".join(["job_priorities took junk levels:", *taken])
print("held")
