"""The instruction counter's reading of ``callgrind_annotate`` output (the valgrind runs themselves
are too slow for the suite: ``python -m tracer.tools.bench.instructions`` is run by hand)."""

from __future__ import annotations

from tracer.tools.bench.instructions import eval_loop_instructions

# the shape callgrind_annotate 3.19 prints with --show=Ir (paths shortened)
ANNOTATED = """\
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
1,335,166,532 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                   file:function
--------------------------------------------------------------------------------
91,812,042 ( 6.88%)  /tmp/Python-3.11.7/Python/ceval.c:_PyEval_EvalFrameDefault'2 [/lib/libpython3.11.so.1.0]
61,583,243 ( 4.61%)  /tmp/Python-3.11.7/Parser/pegen.c:_PyPegen_is_memoized [/lib/libpython3.11.so.1.0]
 2,477,458 ( 0.19%)  /tmp/Python-3.11.7/./Include/internal/pycore_frame.h:_PyEval_EvalFrameDefault'2
   323,823 ( 0.02%)  /tmp/Python-3.11.7/Python/ceval.c:_PyEval_EvalFrameDefault [/lib/libpython3.11.so.1.0]
    10,000 ( 0.00%)  /tmp/Python-3.11.7/Python/ceval.c:_PyEval_EvalFrameDefaultish [/lib/libpython3.11.so.1.0]
     8,766 ( 0.00%)  /tmp/Python-3.11.7/./Include/internal/pycore_frame.h:_PyEval_EvalFrameDefault
"""


def test_every_level_and_inlined_part_of_the_bytecode_loop_is_summed_and_nothing_else() -> None:
    assert eval_loop_instructions(ANNOTATED) == 91_812_042 + 2_477_458 + 323_823 + 8_766


def test_no_bytecode_loop_is_zero() -> None:
    assert eval_loop_instructions("") == 0
