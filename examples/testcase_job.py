"""The incident scenario as library code, on the embedded broker (no Java needed):

    python examples/testcase_job.py round_robin
    python examples/testcase_job.py aggressive
"""

from __future__ import annotations

import sys

from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from tracer.tools.demo import DemoOptions, run_demo, where_time_went


def main() -> None:
    policies = tuple(sys.argv[1:]) or ("round_robin", "aggressive")
    runs = run_demo(DemoOptions(groups=300, workers=8, case_ms=5, policies=policies),
                    tracer_provider=TracerProvider(), registry=CollectorRegistry())
    for run in runs:
        print(f"{run.policy:12} job {run.makespan_s:6.2f} s   lower bound {run.lower_bound_s:6.2f} s")
        print("   ", where_time_went(run))


if __name__ == "__main__":
    main()
