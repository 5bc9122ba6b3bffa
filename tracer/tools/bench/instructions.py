"""Instructions per message of each ``bench overhead`` loop, counted by valgrind's callgrind.

Instruction counts do not move with the machine's load, so they tell a change in our code from a
busy neighbour where the CPU-time ratios of :mod:`tracer.tools.bench.overhead` cannot. Each loop
runs in a process of its own under ``valgrind --tool=callgrind`` twice, with ``short`` and
``long`` messages after the same warm-up; the difference over ``long - short`` messages is the
per-message count, start-up and imports cancelled out (the export thread's work is included, as
the CPU-time bench includes it; the heap left by start-up and the warm-up is frozen, ``gc.freeze``,
so a full collection's scan of everything imported does not land in one run and not the other).

Beside the total, the instructions spent in the bytecode loop itself (``_PyEval_EvalFrameDefault``,
read with ``callgrind_annotate``): an instruction there costs several times the CPU time of one in
the C code the loop calls (dict, frame, attribute helpers), so two loops with the same total can
differ by a third in CPU time — how a full trace at 0.98 of the contrib span's instructions runs at
1.3 of its CPU time (docs/benchmarks-history.md, "Session 10"). Compare commits on both.

``python -m tracer.tools.bench.instructions [LOOP ...] [--short N] [--long N] [--json]`` (needs
``valgrind`` and its ``callgrind_annotate`` on the PATH); ``python -m tracer.tools.bench.instructions --child LOOP N`` is one
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

__all__ = ["LOOPS", "count_loop", "eval_loop_instructions", "main"]

LOOPS = ("span", "contrib_process", "stamps_metrics", "full_trace", "compact_trace", "sampled_out")
_WARM = 300
_TOTAL = re.compile(rb"^(?:summary|totals):\s*(\d+)", re.M)
# a callgrind_annotate line: "1,234 (5.6%)  file:function [object]"
_FUNCTION = re.compile(r"^\s*([\d,]+)\s+(?:\([^)]*\)\s+)?\S*:(\S+)", re.M)
_EVAL_LOOP = "_PyEval_EvalFrameDefault"


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


def eval_loop_instructions(annotated: str) -> int:
    """The instructions ``callgrind_annotate`` output attributes to the bytecode loop (every
    ``_PyEval_EvalFrameDefault`` entry, recursion levels included)."""
    return sum(int(count.replace(",", "")) for count, fn in _FUNCTION.findall(annotated)
               if fn.split("'")[0] == _EVAL_LOOP)


def _instructions(loop: str, messages: int) -> tuple[int, int]:
    """(all instructions, the bytecode loop's) of one child process."""
    valgrind, annotate = shutil.which("valgrind"), shutil.which("callgrind_annotate")
    if valgrind is None or annotate is None:
        raise RuntimeError("valgrind and callgrind_annotate must be on the PATH")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        subprocess.run([valgrind, "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-line=no",
                        sys.executable, "-m", "tracer.tools.bench.instructions", "--child", loop, str(messages)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out, "rb") as f:
            found = _TOTAL.findall(f.read())
        annotated = subprocess.run([annotate, "--threshold=100", "--show=Ir", out], check=True,
                                   capture_output=True, text=True).stdout
    if not found:
        raise RuntimeError("callgrind wrote no total")
    return int(found[-1]), eval_loop_instructions(annotated)


def count_loop(loop: str, short: int = 200, long: int = 2200) -> tuple[float, float]:
    """Instructions per message of ``loop`` (one of :data:`LOOPS`): all of them, and the bytecode loop's."""
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {', '.join(LOOPS)}, got {loop!r}")
    if not 0 < short < long:
        raise ValueError("need 0 < short < long")
    (total_a, eval_a), (total_b, eval_b) = _instructions(loop, short), _instructions(loop, long)
    return (total_b - total_a) / (long - short), (eval_b - eval_a) / (long - short)


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
    counts = {loop: count_loop(loop, args.short, args.long) for loop in args.loops or LOOPS}
    if args.json:
        result: dict[str, Any] = {"instructions": {loop: c[0] for loop, c in counts.items()},
                                  "eval_loop": {loop: c[1] for loop, c in counts.items()}}
        print(json.dumps(result))
    else:
        for loop, (total, in_loop) in counts.items():
            print(f"{loop:<18}{total:12.0f} instructions a message, {in_loop:10.0f} in the bytecode loop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
