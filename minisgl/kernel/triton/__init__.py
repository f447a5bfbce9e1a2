"""The book's Triton kernels (chapters 19 and 21), one module per kernel family.

* ``store``: the KV store and the embedding gather (rows moved, nothing computed);
* ``gemv``: a small-batch matrix-vector product with split-K;
* ``fused``: the layer's GEMVs of a decode step, with the norm, SwiGLU and residual add fused in;
* ``lm_head``: the final norm and the LM head in one persistent kernel;
* ``decode``: split-KV decode attention for a few requests;
* ``sample``: temperature sampling in one pass over the logits (the Gumbel-max trick);
* ``moe``: the grouped GEMM of a mixture of experts (chapter 21);
* ``pdl``, ``timeline``, ``checks``: what the kernels share (programmatic dependent launch,
  per-program timestamps, the host-side checks of their operands).

Nothing here is called directly by the engine: every op goes through the table in
``minisgl.kernel``, which picks a kernel of this package only where Triton runs (CUDA, or
the CPU under ``TRITON_INTERPRET=1``). Importing this package imports no Triton; its modules do.
"""
