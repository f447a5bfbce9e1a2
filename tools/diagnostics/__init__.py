"""Checks of the engine itself on real hardware, apart from the book's machinery:

* ``python -m tools.diagnostics.gpu_check``: every GPU path of stage 4, with PASS/FAIL lines;
* ``python -m tools.diagnostics.tp_compare``: served greedy texts at tp=1 and tp=N (chapter 16);
* ``python -m tools.diagnostics.tp_logits``: teacher-forced logits at tp=1 and tp=N, step by step.
"""
