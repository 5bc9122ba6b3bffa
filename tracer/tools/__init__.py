"""The command line and what only it uses: demo, workload generator, benchmarks.

The library never imports this package.
"""

__all__: list[str] = []
