"""Instructions per message of each ``bench overhead`` loop, counted by valgrind's callgrind.

Instruction counts do not move with the machine's load, so they tell a change in our code from a
busy neighbour where the CPU-time ratios of :mod:`tracer.tools.bench.overhead` cannot. Each loop
runs in a process of its own under ``valgrind --tool=callgrind`` twice, with ``short`` and
``long`` messages after the same warm-up; the difference over ``long - short`` messages is the
per-message count, start-up and imports cancelled out (the export thread's work is included, as
the CPU-time bench includes it; the heap left by start-up and the warm-up is frozen, ``gc.freeze``,
so a full collection's scan of everything imported does not land in one run and not the other).

``python -m tracer.tools.bench.instructions [LOOP ...] [--short N] [--long N] [--json]`` (needs
``valgrind`` on the PATH); ``python -m tracer.tools.bench.instructions --child LOOP N`` is one
process's loop, what valgrind runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

__all__ = ["LOOPS", "count_loop", "main"]

LOOPS = ("span", "contrib_process", "stamps_metrics", "full_trace", "compact_trace", "sampled_out")
_WARM = 300
_TOTAL = re.compile(rb"^(?:summary|totals):\s*(\d+)", re.M)


def _child(loop: str, messages: int) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from ...telemetry.hold import HoldingSpanProcessor
    from ...telemetry.keep import KeepPolicy
    from .overhead import _batch, _loops, _provider

    provider = _provider()
    hold = HoldingSpanProcessor([_batch()])
    held_provider = TracerProvider()
    held_provider.add_span_processor(hold)
    policy = KeepPolicy({"dispatch_wait": 10.0, "end_to_end": 600.0}, background=0.0)
    fn = _loops(provider, held_provider, hold, policy)[loop]
    fn(_WARM)
    provider.force_flush()
    held_provider.force_flush()
    # what start-up and the warm-up left is frozen: a full collection scans everything imported,
    # and one more of them in one of the two runs moved a loop's count by several per cent
    gc.collect()
    gc.freeze()
    fn(messages)
    provider.shutdown()
    held_provider.shutdown()


def _instructions(loop: str, messages: int) -> int:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise RuntimeError("valgrind is not on the PATH")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        subprocess.run([valgrind, "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-line=no",
                        sys.executable, "-m", "tracer.tools.bench.instructions", "--child", loop, str(messages)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out, "rb") as f:
            found = _TOTAL.findall(f.read())
    if not found:
        raise RuntimeError("callgrind wrote no total")
    return int(found[-1])


def count_loop(loop: str, short: int = 200, long: int = 2200) -> float:
    """Instructions per message of ``loop`` (one of :data:`LOOPS`)."""
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {', '.join(LOOPS)}, got {loop!r}")
    if not 0 < short < long:
        raise ValueError("need 0 < short < long")
    return (_instructions(loop, long) - _instructions(loop, short)) / (long - short)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tracer.tools.bench.instructions")
    p.add_argument("loops", nargs="*", metavar="LOOP", help=f"default: all of {', '.join(LOOPS)}")
    p.add_argument("--short", type=int, default=200)
    p.add_argument("--long", type=int, default=2200)
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", nargs=2, metavar=("LOOP", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return 0
    result: dict[str, Any] = {loop: count_loop(loop, args.short, args.long) for loop in args.loops or LOOPS}
    if args.json:
        print(json.dumps(result))
    else:
        for loop, count in result.items():
            print(f"{loop:<18}{count:12.0f} instructions a message")
    return 0


if __name__ == "__main__":
    sys.exit(main())
