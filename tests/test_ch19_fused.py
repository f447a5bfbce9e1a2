"""Chapter 19: the fused batch-1 decode path.

The fused path must give the unfused path's logits: on the CPU the model takes it through
the torch references (``use_fused_decode`` patched to say yes) and, in a subprocess under
``TRITON_INTERPRET=1``, through the Triton kernels themselves, in float32, where the only
difference is the order of sums. The kernels are also compared one by one with their
references. On a GPU: the kernels at Qwen3-0.6B's shapes in bf16, and the engine's logits
with the path on and off (``MINISGL_DISABLE_FUSED_DECODE``), within the tolerance chapter
17 uses for FlashInfer against the torch backend.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import minisgl.models.utils as model_utils
from minisgl import kernel
from minisgl.benchmark import manual
from minisgl.kernel import torch_ops
from tests.helpers import MODELS, ROOT, SMOLLM2, hf_encode

HAS_TRITON = importlib.util.find_spec("triton") is not None
PROMPTS = ["The capital of France is", "def fibonacci(n):"]
STEPS = 4  # a prefill (unfused: more than two tokens) and three fused decode steps


def _cpu_engine(path):
    from minisgl.engine import Engine, EngineConfig

    return Engine(
        EngineConfig(
            str(path),
            dtype=torch.float32,
            device="cpu",
            max_running_req=2,
            num_page_override=64,
            max_seq_len_override=32,
        )
    )


def _logits(engine, path, n_prompts, forced=None):
    ids = [hf_encode(path, p) for p in PROMPTS[:n_prompts]]
    return manual.greedy(
        engine, manual.place(engine, ids, STEPS), STEPS, use_graph=False, forced=forced
    )


def _count_calls(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


# --------------------------------------------------------------------------- CPU


def test_the_batch_1_path_stays_off_on_the_cpu():
    x = torch.zeros(1, 8)
    assert not kernel.use_fused_decode(x) and not kernel.use_fused_decode(x.bfloat16())
    assert not kernel.use_small_decode_attention(x.bfloat16())


def test_a_kernel_module_a_later_chapter_brings_counts_as_absent():
    """In a step tree (tools/steps.py) ``triton_fused`` may be missing: the op falls back."""
    assert kernel.introduced("triton_fused") and kernel.introduced("triton_decode")
    assert not kernel.introduced("no_such_kernel_module")


@pytest.mark.parametrize("model", ["qwen3_path", "qwen2_path"])  # QK-norm; qkv bias
@pytest.mark.parametrize("n_prompts", [1, 2])
def test_the_fused_path_gives_the_unfused_logits(model, n_prompts, request, monkeypatch):
    path = request.getfixturevalue(model)
    engine = _cpu_engine(path)
    tokens, plain = _logits(engine, path, n_prompts)
    monkeypatch.setattr(model_utils, "use_fused_decode", lambda x: x.shape[0] <= 2)
    calls = _count_calls(monkeypatch, model_utils, "norm_linear")
    fused_tokens, fused = _logits(engine, path, n_prompts, forced=tokens)
    layers = len(engine.model.model.layers)
    assert (
        len(calls) == (STEPS - 1) * 2 * layers
    )  # every decode step, both sublayers, and no prefill
    for step, (a, b) in enumerate(zip(fused, plain)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=lambda m: f"step {step}: {m}")
    assert [row.tolist() for row in torch.stack(fused, 1).argmax(-1)] == tokens
    engine.shutdown()


def test_a_backend_that_always_stores_keeps_the_unfused_path(qwen3_path, monkeypatch):
    """A backend without ``accepts_stored_kv`` (a learner's, say) is never given k = v = None."""
    from minisgl.attention.torch_backend import TorchAttnBackend

    class StoresItself(TorchAttnBackend):
        accepts_stored_kv = False

        def forward(self, q, k, v, layer_id, batch):
            assert k is not None and v is not None, "the fused path reached a backend that stores"
            return super().forward(q, k, v, layer_id, batch)

    engine = _cpu_engine(qwen3_path)
    cfg = engine.config.model_config
    engine.attn_backend = engine.ctx.attn_backend = StoresItself(
        cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
    )
    monkeypatch.setattr(model_utils, "use_fused_decode", lambda x: True)
    calls = _count_calls(monkeypatch, model_utils, "norm_linear")
    _logits(engine, qwen3_path, 1)
    assert not calls
    engine.shutdown()


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install triton)")
@pytest.mark.parametrize("m", [1, 2])
def test_every_qwen3_gemv_reads_its_whole_row_before_the_pdl_wait(m):
    """The tile rule measured on the H200: one tile covers all of K (the loads before
    ``gdc_wait``), without more accumulators per thread than the registers hold, nor more
    than 16 KiB of weights per program; the rows per program chapter 19 reports."""
    from minisgl.kernel import triton_fused as tf

    rows = []
    for n, k, swiglu in (
        (4096, 1024, False),
        (3072, 1024, True),
        (1024, 2048, False),
        (1024, 3072, False),
    ):
        cfg = tf.fused_gemv_config(m, n, k, swiglu)
        per_thread = (
            cfg.block_m * cfg.block_n * cfg.block_k * (2 if swiglu else 1) // (32 * cfg.num_warps)
        )
        assert cfg.block_k >= k and cfg.block_m >= m and per_thread <= tf.MAX_ACC_PER_THREAD, (
            n,
            k,
            cfg,
        )
        assert (
            cfg.block_n * k * (2 if swiglu else 1) <= tf.MAX_TILE_WEIGHTS
            and n // cfg.block_n >= tf.MIN_PROGRAMS
        )
        rows.append(cfg.block_n)
    assert rows == [8, 4, 4, 2], rows  # qkv, gate/up, o, down
    wide = tf.fused_gemv_config(
        m, 1024, 14336
    )  # K past MAX_BLOCK_K: several tiles, still in budget
    assert wide.block_k == tf.MAX_BLOCK_K


# the batch-1 kernels' argument types as the engine launches them, and Qwen3-0.6B's split-KV constants
_BF, _I32, _F32 = "*bf16", "i32", "fp32"
GEMV_TYPES = dict(
    x_ptr=_BF,
    w_ptr=_BF,
    bias_ptr=_BF,
    norm_w_ptr=_BF,
    res_ptr=_BF,
    out_ptr=_BF,
    M=_I32,
    N=_I32,
    stride_xm=_I32,
    stride_wn=_I32,
    stride_rm=_I32,
    stride_om=_I32,
    eps=_F32,
)
PARTIAL_TYPES = dict(
    q_ptr=_BF,
    k_ptr=_BF,
    v_ptr=_BF,
    indptr_ptr="*i32",
    page_ids_ptr="*i32",
    last_len_ptr="*i32",
    part_o_ptr="*fp32",
    part_lse_ptr="*fp32",
    pos_ptr="*i64",
    loc_ptr="*i32",
    cos_sin_ptr="*fp32",
    q_norm_ptr=_BF,
    k_norm_ptr=_BF,
    sm_scale=_F32,
    stride_slot=_I32,
    num_splits=_I32,
    stride_q=_I32,
    eps=_F32,
)
PARTIAL_QWEN3 = dict(
    MAX_ITERS=1,
    GROUP=2,
    BLOCK_G=16,
    HEAD_DIM=128,
    NUM_KV_HEADS=8,
    PAGE=256,
    BLOCK_T=64,
    PDL=True,
    HAS_QK_NORM=True,
)
MERGE_TYPES = dict(
    part_o_ptr="*fp32",
    part_lse_ptr="*fp32",
    out_ptr=_BF,
    indptr_ptr="*i32",
    last_len_ptr="*i32",
    num_splits=_I32,
)
MERGE_QWEN3 = dict(
    NUM_QO_HEADS=16, HEAD_DIM=128, PAGE=256, BLOCK_T=64, BLOCK_S=64, BLOCK_D=32, PDL=True
)


def _ptx_for_hopper(
    kernel, types: dict, constexprs: dict, num_warps: int = 4, aligned: tuple = ()
) -> str:
    """``kernel`` compiled for sm_90 (an H100/H200) by Triton's compiler and its bundled ptxas,
    on this machine, GPU or not; returns the PTX. Arguments not in ``types`` are constexprs;
    those in ``aligned`` are known multiples of 16 (as Triton specialises a launch whose
    pointers and strides are), without which it cannot vectorise their loads."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {name: types.get(name, "constexpr") for name in kernel.arg_names}
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(kernel.arg_names)
        if name in aligned
    }
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps)
    ).asm["ptx"]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install triton)")
def test_the_batch_1_kernels_compile_for_hopper_with_pdl():
    """The interpreter runs the kernels' logic on the CPU but not the GPU compiler: this
    compiles each one for sm_90 at Qwen3-0.6B's shapes (and SmolLM2's o_proj), as the
    engine launches them, and checks the PTX waits for the kernel before and lets the next
    one start."""
    from minisgl.kernel import triton_decode as td
    from minisgl.kernel import triton_fused as tf

    ptx = []
    for m, n, k, norm, swiglu in (
        (1, 4096, 1024, True, False),
        (1, 3072, 1024, True, True),
        (1, 1024, 2048, False, False),
        (2, 1024, 3072, False, False),
        (1, 576, 576, False, False),
    ):  # SmolLM2's o_proj: two rows of 576
        cfg = tf.fused_gemv_config(m, n, k, swiglu)
        ptx.append(
            _ptx_for_hopper(
                tf._fused_gemv_kernel,
                GEMV_TYPES,
                dict(
                    K=k,
                    BLOCK_M=cfg.block_m,
                    BLOCK_N=cfg.block_n,
                    BLOCK_K=cfg.block_k,
                    NORM=norm,
                    SWIGLU=swiglu,
                    ADD_RESIDUAL=not norm,
                    HAS_BIAS=False,
                    PDL=True,
                ),
                cfg.num_warps,
            )
        )
    ptx.append(
        _ptx_for_hopper(
            tf._qk_norm_rope_store_kernel,
            dict(
                qkv_ptr=_BF,
                q_out_ptr=_BF,
                k_slots_ptr=_BF,
                v_slots_ptr=_BF,
                loc_ptr="*i32",
                pos_ptr="*i64",
                cos_sin_ptr="*fp32",
                q_norm_ptr=_BF,
                k_norm_ptr=_BF,
                stride_qkv=_I32,
                stride_slot=_I32,
                eps=_F32,
            ),
            dict(NUM_QO_HEADS=16, NUM_KV_HEADS=8, HEAD_DIM=128, HAS_QK_NORM=True, PDL=True),
        )
    )
    assert PARTIAL_QWEN3["BLOCK_T"] == td.BLOCK_T and MERGE_QWEN3["BLOCK_D"] == td.MERGE_BLOCK_D
    for from_qkv in (False, True):
        ptx.append(
            _ptx_for_hopper(
                td._decode_partial_kernel,
                PARTIAL_TYPES,
                dict(PARTIAL_QWEN3, FROM_QKV=from_qkv),
                td.NUM_WARPS,
            )
        )
    ptx.append(_ptx_for_hopper(td._decode_merge_kernel, MERGE_TYPES, MERGE_QWEN3, td.MERGE_WARPS))
    for code in ptx:
        assert "griddepcontrol.wait" in code and "griddepcontrol.launch_dependents" in code


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install triton)")
def test_the_lm_head_grid_covers_the_vocabulary_two_programs_per_sm(monkeypatch):
    import minisgl.kernel as kernel
    from minisgl.kernel import triton_lm_head as tlh

    for n, sms in ((151936, 132), (49152, 132), (100, 132), (8, 4)):
        cfg = tlh.lm_head_config(n, sms)
        tiles = -(-n // cfg.block_n)
        assert (
            cfg.programs <= tlh.LM_HEAD_PROGRAMS_PER_SM * sms and cfg.programs <= tiles
        )  # none without a tile
        assert (
            cfg.programs * (cfg.iters - 1) < tiles <= cfg.programs * cfg.iters
        )  # every tile, no turn to spare
    with pytest.raises(ValueError):
        tlh.lm_head_config(0, 132)
    x, w = torch.randn(1, 16), torch.randn(8, 16)
    for bad in (
        dict(norm_weight=torch.ones(8)),
        dict(x=torch.randn(1, 5000), weight=torch.randn(8, 5000), norm_weight=torch.ones(5000)),
        dict(weight=torch.randn(8, 12)),
    ):
        with pytest.raises(ValueError):
            tlh.norm_lm_head(**{**dict(x=x, norm_weight=torch.ones(16), eps=1e-6, weight=w), **bad})
    # a hidden size the kernel does not take stays on the torch reference, on CUDA too
    monkeypatch.setattr(kernel, "use_triton", lambda t: True)
    x, nw, w = torch.randn(1, 5000), torch.rand(5000), torch.randn(8, 5000)
    assert torch.equal(kernel.norm_lm_head(x, nw, 1e-6, w), torch_ops.norm_linear(x, nw, 1e-6, w))


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install triton)")
def test_the_lm_head_kernel_compiles_for_hopper_with_its_pipeline():
    """As the engine launches it on an H200 at Qwen3-0.6B's shapes: Triton's software
    pipeline turns the loop's loads into asynchronous copies, and the kernel, launched
    without PDL, has no PDL wait or trigger."""
    from minisgl.kernel import triton_lm_head as tlh

    cfg = tlh.lm_head_config(151936, 132)
    types = dict(
        x_ptr=_BF,
        norm_w_ptr=_BF,
        w_ptr=_BF,
        out_ptr=_BF,
        M=_I32,
        N=_I32,
        stride_xm=_I32,
        stride_wn=_I32,
        stride_om=_I32,
        eps=_F32,
    )
    ptx = _ptx_for_hopper(
        tlh._norm_lm_head_kernel,
        types,
        dict(
            K=1024, BLOCK_M=1, BLOCK_N=cfg.block_n, BLOCK_K=1024, ITERS=cfg.iters, STAGES=cfg.stages
        ),
        cfg.num_warps,
        aligned=("x_ptr", "norm_w_ptr", "w_ptr", "out_ptr", "stride_wn"),
    )
    assert "cp.async.cg.shared.global" in ptx and "griddepcontrol" not in ptx


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install triton)")
def test_the_kernel_chain_benchmark_compiles_for_hopper():
    """``benchmarks/kernel_chain.py`` runs on a GPU only: its link kernel must carry PDL's
    wait and trigger, and its persistent kernel the atomics of its grid barrier."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import kernel_chain

    link = _ptx_for_hopper(
        kernel_chain._link_kernel, dict(x_ptr="*bf16", y_ptr="*bf16"), dict(K=1024, PDL=True)
    )
    assert "griddepcontrol.wait" in link and "griddepcontrol.launch_dependents" in link
    barrier = _ptx_for_hopper(
        kernel_chain._persistent_kernel,
        dict(x_ptr="*bf16", counter_ptr="*i32", num_programs="i32"),
        dict(STEPS=3, K=2048, PER=8),
    )
    assert "atom.global.gpu.acq_rel.add" in barrier


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install triton)")
def test_the_layer_timeline_instruments_every_fused_kernel(tmp_path, monkeypatch):
    """``benchmarks/layer_timeline.py`` patches copies of the kernel modules' source: every
    kernel must get its stamps (start, wait, each return and end) and every launch its stamps
    buffer (a kernel or launch the patterns miss would time nothing), and the instrumented
    layer kernels must still compile for sm_90 with their timer reads."""
    import types

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import layer_timeline

    stamps = types.ModuleType("minisgl.kernel._timed_stamps")
    stamps.next_stamps = lambda: None
    monkeypatch.setitem(sys.modules, stamps.__name__, stamps)
    for name in ("triton_fused", "triton_decode"):
        source = (layer_timeline.KERNEL_DIR / f"{name}.py").read_text()
        kernels = len(re.findall(r"^def _\w+_kernel\($", source, re.M))
        # each kernel's body, up to the next top-level line
        bodies = re.findall(r"^def _\w+_kernel\(.*?^\):\n(.*?)(?=^\S)", source, re.M | re.S)
        returns = sum(
            len(re.findall(r"^\s+return\b", body, re.M)) for body in bodies
        )  # the early exits
        launches = source.count("**launch_options(pdl),")
        timed = layer_timeline.instrument(source)
        assert timed.count("STAMPS=_next_stamps()") == launches == kernels, name
        assert timed.count("_waited = _now()") == kernels, name
        assert timed.count("_record(STAMPS") == kernels + returns, name
    # a kernel that ends the file still gets its end stamp
    last = layer_timeline.instrument("def _k_kernel(\n    x,\n):\n    y = x")
    assert last.rstrip().endswith("_record(STAMPS, _started, _waited)"), last
    try:
        fused = layer_timeline.load_instrumented(tmp_path, "triton_fused")
        decode = layer_timeline.load_instrumented(tmp_path, "triton_decode")
    finally:
        for name in ("triton_fused", "triton_decode"):
            sys.modules.pop(f"minisgl.kernel._timed_{name}", None)
    codes = [
        _ptx_for_hopper(
            fused._fused_gemv_kernel,
            dict(GEMV_TYPES, STAMPS="*i64"),
            dict(
                K=1024,
                BLOCK_M=1,
                BLOCK_N=8,
                BLOCK_K=1024,
                NORM=True,
                SWIGLU=False,
                ADD_RESIDUAL=False,
                HAS_BIAS=False,
                PDL=True,
            ),
        ),
        _ptx_for_hopper(
            decode._decode_partial_kernel,
            dict(PARTIAL_TYPES, STAMPS="*i64"),
            dict(PARTIAL_QWEN3, FROM_QKV=True),
        ),
        _ptx_for_hopper(
            decode._decode_merge_kernel, dict(MERGE_TYPES, STAMPS="*i64"), MERGE_QWEN3, 1
        ),
    ]
    for code in codes:  # start, after the wait, end (and the early return's, in the partial kernel)
        assert code.count("%globaltimer") >= 3 and "griddepcontrol.wait" in code


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install triton)")
def test_the_kernels_refuse_bad_input_before_launching():
    """Checked on the host, so a wrong call is a ValueError, never an out-of-bounds kernel."""
    from minisgl.kernel import triton_decode
    from minisgl.kernel import triton_fused as tf

    def refused(fn, *args, **kwargs):
        with pytest.raises(ValueError):
            fn(*args, **kwargs)

    x, w = torch.randn(1, 16), torch.randn(8, 16)
    refused(
        tf.norm_gemv, x, torch.ones(16), 1e-6, w, torch.zeros(8, dtype=torch.bfloat16)
    )  # bias dtype
    refused(
        tf.norm_gemv, x, torch.ones(16), 1e-6, torch.randn(7, 16), swiglu=True
    )  # odd [gate | up]
    refused(tf.norm_gemv, x.int(), torch.ones(16), 1e-6, w.int())  # integers
    refused(tf.gemv_add_residual_, x, w, torch.randn(4, 8))  # residual of another shape
    refused(tf.gemv_add_residual_, x, w, torch.randn(1, 16)[:, ::2])  # residual rows not contiguous
    qkv, slots = torch.randn(2, (4 + 2 * 2) * 16), torch.zeros(10, 2, 16)
    good = dict(
        qkv=qkv,
        positions=torch.tensor([0, 1]),
        cos_sin_cache=torch.zeros(8, 16),
        q_norm=None,
        k_norm=None,
        eps=1e-6,
        k_slots=slots,
        v_slots=slots.clone(),
        out_loc=torch.tensor([3, 4]),
        num_qo_heads=4,
        num_kv_heads=2,
        head_dim=16,
    )
    for bad in (
        dict(v_slots=torch.zeros(3, 2, 16)),
        dict(out_loc=torch.tensor([3])),
        dict(positions=torch.tensor([0])),
        dict(q_norm=torch.ones(8), k_norm=torch.ones(8)),
        dict(cos_sin_cache=torch.zeros(16, 8).t()),
        dict(head_dim=12),
        dict(q_norm=torch.ones(16)),
        dict(cos_sin_cache=torch.zeros(16)),
        dict(positions=torch.tensor([0.0, 1.0])),
    ):
        refused(tf.qk_norm_rope_store, **{**good, **bad})
    q, index = (
        torch.randn(2, 4, 16),
        [
            torch.tensor([0, 1, 2], dtype=torch.int32),
            torch.tensor([0, 1], dtype=torch.int32),
            torch.tensor([1, 1], dtype=torch.int32),
        ],
    )
    good = dict(
        q=q,
        k_slots=slots,
        v_slots=slots.clone(),
        kv_indptr=index[0],
        kv_page_ids=index[1],
        kv_last_page_len=index[2],
        page_size=1,
        sm_scale=0.25,
        max_seq_len=8,
    )
    for bad in (
        dict(kv_indptr=index[0][:2]),
        dict(kv_last_page_len=index[2][:1]),
        dict(v_slots=slots[:, :1]),
        dict(q=q.bfloat16()),
        dict(num_splits=0),
        dict(page_size=0),
        dict(max_seq_len=0),
        dict(k_slots=slots[:, 0], v_slots=slots[:, 0]),
    ):
        refused(triton_decode.decode_attention, **{**good, **bad})
    good = dict(
        qkv=qkv,
        positions=torch.tensor([0, 1]),
        cos_sin_cache=torch.zeros(8, 16),
        q_norm=None,
        k_norm=None,
        eps=1e-6,
        k_slots=slots,
        v_slots=slots.clone(),
        out_loc=torch.tensor([3, 4]),
        kv_indptr=index[0],
        kv_page_ids=index[1],
        kv_last_page_len=index[2],
        page_size=1,
        sm_scale=0.25,
        max_seq_len=8,
        num_qo_heads=4,
    )
    strided = torch.tensor([0, 9, 1, 9, 2, 9], dtype=torch.int32)[
        ::2
    ]  # kv_indptr's values, every other element
    for bad in (
        dict(num_qo_heads=3),
        dict(qkv=qkv[:, :-16]),
        dict(out_loc=torch.tensor([3])),
        dict(q_norm=torch.ones(8), k_norm=torch.ones(8)),
        dict(cos_sin_cache=torch.zeros(8, 16).double()),
        dict(kv_last_page_len=index[2][:1]),
        dict(kv_indptr=strided),
        dict(kv_page_ids=index[1].float()),
        dict(q_norm=torch.ones(16)),
        dict(cos_sin_cache=torch.zeros(16)),
        dict(out_loc=torch.tensor([3.0, 4.0])),
        dict(qkv=qkv.int(), k_slots=slots.int(), v_slots=slots.int()),
    ):
        refused(triton_decode.decode_attention_qkv, **{**good, **bad})


def test_the_references_are_the_unfused_ops():
    torch.manual_seed(0)
    x, w, nw, r = torch.randn(2, 16), torch.randn(12, 16), torch.randn(16), torch.randn(2, 12)
    normed = torch_ops.rms_norm(x, nw, 1e-6)
    assert torch.equal(torch_ops.norm_linear(x, nw, 1e-6, w), normed @ w.T)
    gate, up = (normed @ w.T).chunk(2, dim=-1)
    assert torch.equal(
        torch_ops.norm_linear(x, nw, 1e-6, w, swiglu=True), torch.nn.functional.silu(gate) * up
    )
    expect = r + x @ w.T
    assert torch.equal(torch_ops.linear_add_residual_(x, w, r, None), expect) and torch.equal(
        r, expect
    )


KERNEL_SCRIPT = """
import torch
from minisgl.kernel import torch_ops, triton_fused as tf, triton_lm_head as tlh
from minisgl.layers.rotary import _cos_sin_cache

def check(got, ref, what, tol):
    err = float((got.float() - ref.float()).abs().max())
    scale = float(ref.float().abs().max())
    assert err <= tol * scale, f"{what}: max |diff| {err:.3g} > {tol} x {scale:.3g}"

torch.manual_seed(0)
for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 4e-2)):  # bf16: a few roundings
    for m in (1, 2):
        # one masked tile; three 1,024-wide tiles, the last masked; one 4,096-wide tile
        for n, k, tiles in ((8, 40, None), (12, 3000, (4, 1024)), (6, 4096, None)):
            cfg = tf.FusedGemvConfig(2, *tiles, 4) if tiles else None
            x, xr = torch.randn(m, k), torch.randn(m, k)
            w, nw = torch.randn(n, k) / k ** 0.5, 1 + 0.1 * torch.randn(k)
            b, r = torch.randn(n), torch.randn(m, n)
            for bias in (None, b):
                args = [t.to(dtype) if t is not None else None for t in (x, nw, w, bias)]
                ref = [t.float() if t is not None else None for t in args]  # same inputs, float32 math
                what = f"{dtype} M={m} N={n} K={k} bias={bias is not None}"
                check(tf.norm_gemv(args[0], args[1], 1e-6, args[2], args[3], config=cfg),
                      torch_ops.norm_linear(ref[0], ref[1], 1e-6, ref[2], ref[3]), "norm_gemv " + what, tol)
                check(tf.norm_gemv(args[0], args[1], 1e-6, args[2], args[3], swiglu=True, config=cfg),
                      torch_ops.norm_linear(ref[0], ref[1], 1e-6, ref[2], ref[3], swiglu=True), "swiglu " + what, tol)
                res = r.to(dtype)
                out = tf.gemv_add_residual_(xr.to(dtype), args[2], res, args[3], config=cfg)
                assert out is res
                check(res, torch_ops.linear_add_residual_(xr.to(dtype).float(), ref[2], r.to(dtype).float(), ref[3]),
                      "add_residual " + what, tol)
    T, hq, hkv, d = 3, 4, 2, 16
    cos_sin = _cos_sin_cache(d, 64, 10000.0, None, torch.device("cpu"))
    pos, loc = torch.tensor([0, 5, 17]), torch.tensor([7, 2, 9], dtype=torch.int32)
    qkv = torch.randn(T, (hq + 2 * hkv) * d).to(dtype)
    norms = (1 + 0.1 * torch.randn(d)).to(dtype), (1 + 0.1 * torch.randn(d)).to(dtype)
    for q_norm, k_norm in (norms, (None, None)):
        slots = [torch.zeros(12, hkv, d, dtype=dtype) for _ in range(4)]
        q = tf.qk_norm_rope_store(qkv, pos, cos_sin, q_norm, k_norm, 1e-6, slots[0], slots[1], loc, hq, hkv, d)
        q_ref = torch_ops.qk_norm_rope_store(qkv, pos, cos_sin, q_norm, k_norm, 1e-6, slots[2], slots[3],
                                             loc.long(), hq, hkv, d)
        what = f"qk_norm_rope_store {dtype} norm={q_norm is not None}"
        check(q, q_ref, what + " q", tol)
        check(slots[0], slots[2], what + " k", tol)
        assert torch.equal(slots[1], slots[3]), what + " v"  # a copy
        assert not slots[0][[0, 1, 3, 4, 5, 6, 8, 10, 11]].any(), what + " wrote outside out_loc"
    # the LM head (2 programs per SM, 4 SMs in the interpreter): 8 programs over 13 tiles of 8 rows (the
    # last tile masked, three programs' second turn empty), 5 programs over 5 tiles
    for m in (1, 2):
        for n, k in ((100, 64), (37, 40)):
            x, nw, w = torch.randn(m, k).to(dtype), (1 + 0.1 * torch.randn(k)).to(dtype), torch.randn(n, k).to(dtype)
            check(tlh.norm_lm_head(x, nw, 1e-6, w), torch_ops.norm_linear(x.float(), nw.float(), 1e-6, w.float()),
                  f"norm_lm_head {dtype} M={m} N={n} K={k}", tol)
print("kernels ok")
"""

MODEL_SCRIPT = """
import sys, torch
import minisgl.kernel as kernel
import minisgl.models.utils as model_utils
from test_ch19_fused import _cpu_engine, _logits
path = sys.argv[1]
kernel.use_triton = lambda x: True  # the interpreter runs Triton on CPU tensors
import minisgl.kernel.triton_fused as tf
# wide tiles, so the interpreter runs a few programs, not hundreds (the kernel test runs the real tiles)
tf.fused_gemv_config = lambda m, n, k, swiglu=False: tf.FusedGemvConfig(2, 64, 64, 4)
import minisgl.kernel.triton_lm_head as tlh
tlh.lm_head_config = lambda n, sms: tlh.LMHeadConfig(4, 1024, -(-n // 4096), 4, 1)
engine = _cpu_engine(path)
tokens, plain = _logits(engine, path, 2)
model_utils.use_fused_decode = lambda x: x.shape[0] <= 2
calls = []
for module, name in ((tf, "norm_gemv"), (tf, "gemv_add_residual_"), (tf, "qk_norm_rope_store"), (tlh, "norm_lm_head")):
    real = getattr(module, name)
    setattr(module, name, (lambda f: lambda *a, **kw: calls.append(f.__name__) or f(*a, **kw))(real))
_, fused = _logits(engine, path, 2, forced=tokens)
layers = len(engine.model.model.layers)
assert sorted(set(calls)) == ["gemv_add_residual_", "norm_gemv", "norm_lm_head", "qk_norm_rope_store"], calls
assert len(calls) == (5 * layers + 1) * 3, len(calls)  # five kernels a layer and the LM head's, three decode steps
for step, (a, b) in enumerate(zip(fused, plain)):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=lambda m: f"step {step}: {m}")

# FlashInferBackend.forward_qkv's call (FlashInfer itself needs CUDA) on a torch backend: the split-KV
# kernel from qkv, with the batch's own positions, slots, cos/sin table, norms and paged index
from minisgl.attention.fi import paged_kv_index
from minisgl.attention.torch_backend import TorchAttnBackend
from minisgl.core import get_global_ctx
from minisgl.kernel.triton_decode import decode_attention_qkv

class SplitKV(TorchAttnBackend):
    def forward_qkv(self, qkv, qk, layer_id, batch):
        ctx = get_global_ctx()
        index = paged_kv_index(ctx.page_table, batch.padded_reqs, ctx.page_size)
        calls.append("decode_attention_qkv")
        return decode_attention_qkv(qkv, batch.positions, qk.cos_sin_cache, qk.q_norm, qk.k_norm, qk.eps,
                                    ctx.kv_cache.k_slots(layer_id), ctx.kv_cache.v_slots(layer_id), batch.out_loc,
                                    index.kv_indptr, index.kv_page_ids, index.kv_last_page_len, ctx.page_size,
                                    qk.head_dim ** -0.5, ctx.page_table.shape[1], qk.num_qo_heads, num_splits=4)

cfg = engine.config.model_config
engine.attn_backend = engine.ctx.attn_backend = SplitKV(cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim)
calls.clear()
_, split = _logits(engine, path, 2, forced=tokens)
assert calls.count("decode_attention_qkv") == layers * 3 and "qk_norm_rope_store" not in calls, calls
for step, (a, b) in enumerate(zip(split, plain)):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=lambda m: f"split-KV, step {step}: {m}")
print("model ok")
"""


DECODE_SCRIPT = """
import torch
from test_ch19_fused import paged_decode_case, qkv_decode_case
from minisgl.kernel.triton_decode import decode_attention, decode_attention_qkv
for page, lens, hq, hkv in ((1, [37, 100], 4, 2), (4, [5], 8, 2), (16, [130, 1], 2, 2)):
    # 4 splits: 5 tokens leave three chunks empty; 130 tokens span several pages per chunk
    q, k_slots, v_slots, index, want = paged_decode_case(page, lens, hq, hkv, 16, torch.float32, "cpu")
    got = decode_attention(q, k_slots, v_slots, *index, page, 16 ** -0.5, max_seq_len=200, num_splits=4)
    err = float((got - want).abs().max())
    assert err < 1e-5, (page, lens, err)
    for norm in (False, True) if page == 1 else (True,):  # from qkv: norms, RoPE and the store in the kernel
        args, (q_ref, k_ref, v_ref) = qkv_decode_case(page, lens, hq, hkv, 16, norm, k_slots, v_slots, index)
        want = decode_attention(q_ref, k_ref, v_ref, *index, page, 16 ** -0.5, max_seq_len=200, num_splits=4)
        got = decode_attention_qkv(*args, *index, page, 16 ** -0.5, 200, hq, num_splits=4)
        err = float((got - want).abs().max())
        assert err < 1e-5, (page, lens, norm, err)
        assert torch.allclose(args[6], k_ref, atol=1e-6) and torch.equal(args[7], v_ref), "the stored K/V"
# 64 dims: two merge programs per head, each over 32 of them
q, k_slots, v_slots, index, want = paged_decode_case(4, [70], 4, 2, 64, torch.float32, "cpu")
got = decode_attention(q, k_slots, v_slots, *index, 4, 64 ** -0.5, max_seq_len=200, num_splits=4)
assert float((got - want).abs().max()) < 1e-5, "64 dims"
# an empty chunk's program writes no partial and the merge reads none: poisoned with NaN, they change nothing
real_empty = torch.empty
torch.empty = lambda *shape, **kw: real_empty(*shape, **kw).fill_(float("nan"))
try:
    for lens in ([5], [1], [3, 70]):
        q, k_slots, v_slots, index, want = paged_decode_case(4, lens, 4, 2, 16, torch.float32, "cpu")
        got = decode_attention(q, k_slots, v_slots, *index, 4, 16 ** -0.5, max_seq_len=200, num_splits=8)
        assert float((got - want).abs().max()) < 1e-5, ("empty chunks read", lens)
finally:
    torch.empty = real_empty
print("decode ok")
"""


def paged_decode_case(page: int, lens, hq: int, hkv: int, dim: int, dtype, device):
    """A pool of random K/V, requests on shuffled pages, FlashInfer's index of them, and the
    attention of one random query per request computed directly (float32)."""
    gen = torch.Generator().manual_seed(page)
    num_pages = sum(-(-n // page) for n in lens) + 3
    k_slots, v_slots = (torch.randn(num_pages * page, hkv, dim, generator=gen) for _ in range(2))
    order = torch.randperm(num_pages, generator=gen).tolist()
    indptr, page_ids, last, want = [0], [], [], []
    q = torch.randn(len(lens), hq, dim, generator=gen)
    for b, n in enumerate(lens):
        pages = order[indptr[-1] : indptr[-1] + -(-n // page)]
        page_ids += pages
        indptr.append(len(page_ids))
        last.append(n - (len(pages) - 1) * page)
        slots = torch.tensor([pages[t // page] * page + t % page for t in range(n)])
        k = k_slots[slots].to(dtype).float().repeat_interleave(hq // hkv, 1)
        v = v_slots[slots].to(dtype).float().repeat_interleave(hq // hkv, 1)
        scores = torch.einsum("hd,thd->ht", q[b].to(dtype).float(), k) / math.sqrt(dim)
        want.append(torch.einsum("ht,thd->hd", scores.softmax(-1), v))
    index = [torch.tensor(x, dtype=torch.int32, device=device) for x in (indptr, page_ids, last)]
    to = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    return to(q), to(k_slots), to(v_slots), index, torch.stack(want).to(device)


def qkv_decode_case(
    page: int, lens, hq: int, hkv: int, dim: int, norm: bool, k_slots, v_slots, index
):
    """Random ``qkv`` rows for the last token of each request of ``paged_decode_case`` (its
    slot in the index): ``decode_attention_qkv``'s arguments up to the index (on copies of
    the pool), and the reference: ``torch_ops.qk_norm_rope_store``'s queries and pool."""
    from minisgl.layers.rotary import _cos_sin_cache

    gen = torch.Generator().manual_seed(len(lens) + page)
    dev, dtype = k_slots.device, k_slots.dtype
    qkv = torch.randn(len(lens), (hq + 2 * hkv) * dim, generator=gen).to(dev, dtype)
    norms = (
        tuple((1 + 0.1 * torch.randn(dim, generator=gen)).to(dev, dtype) for _ in range(2))
        if norm
        else (None, None)
    )
    cos_sin = _cos_sin_cache(dim, 2048, 1e4, None, torch.device(dev))
    indptr, page_ids, _ = (t.tolist() for t in index)
    pos = torch.tensor([n - 1 for n in lens], device=dev, dtype=torch.int32)
    loc = torch.tensor(
        [page_ids[indptr[b] + (n - 1) // page] * page + (n - 1) % page for b, n in enumerate(lens)],
        device=dev,
        dtype=torch.int32,
    )
    k_ref, v_ref = k_slots.float().clone(), v_slots.float().clone()
    q_ref = torch_ops.qk_norm_rope_store(
        qkv.float(),
        pos,
        cos_sin,
        *(n.float() if norm else None for n in norms),
        1e-6,
        k_ref,
        v_ref,
        loc.long(),
        hq,
        hkv,
        dim,
    )
    args = (qkv, pos, cos_sin, *norms, 1e-6, k_slots.clone(), v_slots.clone(), loc)
    return args, (q_ref.to(dtype).contiguous(), k_ref.to(dtype), v_ref.to(dtype))


def _interpret(script: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
    )
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.skipif(
    not HAS_TRITON, reason="triton is not installed (pip install triton) for the interpreter test"
)
def test_fused_kernels_match_their_references_in_the_interpreter():
    res = _interpret(KERNEL_SCRIPT)
    assert res.returncode == 0 and "kernels ok" in res.stdout, res.stderr[-3000:]


@pytest.mark.skipif(
    not HAS_TRITON, reason="triton is not installed (pip install triton) for the interpreter test"
)
def test_split_kv_decode_attention_matches_softmax_attention_in_the_interpreter():
    res = _interpret(DECODE_SCRIPT)
    assert res.returncode == 0 and "decode ok" in res.stdout, res.stderr[-3000:]


@pytest.mark.skipif(
    not HAS_TRITON, reason="triton is not installed (pip install triton) for the interpreter test"
)
def test_the_model_on_the_fused_triton_kernels_gives_the_unfused_logits(qwen3_path):
    res = _interpret(MODEL_SCRIPT, str(qwen3_path))
    assert res.returncode == 0 and "model ok" in res.stdout, res.stderr[-3000:]


# --------------------------------------------------------------------------- GPU

SHAPED = MODELS / "qwen3-0.6b-shaped"
QWEN3_LAYER = dict(hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2])
def test_fused_kernels_at_qwen3_shapes_match_float32(m):
    """bf16 kernels against float32 math on the same bf16 inputs: 2**-6 of the largest
    output covers the few roundings the kernels make on purpose; a wrong tile is far off."""
    from minisgl.kernel import triton_fused as tf
    from minisgl.kernel.triton_lm_head import norm_lm_head
    from minisgl.layers.rotary import _cos_sin_cache

    c, dev, bf = QWEN3_LAYER, "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(m)
    rand = lambda *s, scale=1.0: (torch.randn(*s, device=dev, generator=gen) * scale).to(bf)  # noqa: E731
    h, i, d = c["hidden"], c["intermediate"], c["head_dim"]
    x, nw = rand(m, h), 1 + rand(h, scale=0.1)
    cases = {
        "qkv": (
            tf.norm_gemv(x, nw, 1e-6, w := rand(4096, h, scale=h**-0.5)),
            torch_ops.norm_linear(x.float(), nw.float(), 1e-6, w.float()),
        ),
        "gate_up": (
            tf.norm_gemv(x, nw, 1e-6, w := rand(2 * i, h, scale=h**-0.5), swiglu=True),
            torch_ops.norm_linear(x.float(), nw.float(), 1e-6, w.float(), swiglu=True),
        ),
    }
    w = rand(
        151936, h, scale=h**-0.5
    )  # Qwen3's vocabulary: the persistent LM head and its final norm
    cases["lm_head"] = (
        norm_lm_head(x, nw, 1e-6, w),
        torch_ops.norm_linear(x.float(), nw.float(), 1e-6, w.float()),
    )
    for name, (n, k) in {"o": (h, 2048), "down": (h, i)}.items():
        a, w, r = rand(m, k), rand(n, k, scale=k**-0.5), rand(m, n)
        want = torch_ops.linear_add_residual_(a.float(), w.float(), r.float())
        cases[name] = (tf.gemv_add_residual_(a, w, r), want)
    qkv, loc = rand(m, 4096), torch.tensor([5, 9][:m], device=dev, dtype=torch.int32)
    pos = torch.tensor([1000, 3][:m], device=dev, dtype=torch.int32)
    cos_sin = _cos_sin_cache(d, 4096, 1e6, None, torch.device(dev))
    norms = 1 + rand(d, scale=0.1), 1 + rand(d, scale=0.1)
    slots = [
        torch.zeros(16, c["kv_heads"], d, device=dev, dtype=dt)
        for dt in (bf, bf, torch.float32, torch.float32)
    ]
    q = tf.qk_norm_rope_store(
        qkv, pos, cos_sin, *norms, 1e-6, slots[0], slots[1], loc, c["heads"], c["kv_heads"], d
    )
    q_ref = torch_ops.qk_norm_rope_store(
        qkv.float(),
        pos,
        cos_sin,
        norms[0].float(),
        norms[1].float(),
        1e-6,
        slots[2],
        slots[3],
        loc.long(),
        c["heads"],
        c["kv_heads"],
        d,
    )
    cases.update(q=(q, q_ref), k_cache=(slots[0], slots[2]), v_cache=(slots[1], slots[3]))
    for name, (got, want) in cases.items():
        assert got.dtype == bf and got.shape == want.shape, name
        rel = float((got.float() - want).abs().max() / want.abs().max())
        assert rel < 2**-6, f"{name} M={m}: max |fused - fp32| / max |fp32| = {rel:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("page", [1, 16])
def test_split_kv_decode_attention_at_qwen3_shapes(page):
    """bf16 q, K, V; float32 softmax over them as the reference. Contexts of 1,000 tokens
    (16 of the 64 chunks of 64 tokens used, the last one partly) and 37 (one chunk, 63
    empty). From qkv, the reference is the same kernel on torch_ops' rotated queries and
    stored K/V."""
    from minisgl.kernel.triton_decode import decode_attention, decode_attention_qkv

    for lens in ([1000], [1000, 37]):
        q, k, v, index, want = paged_decode_case(page, lens, 16, 8, 128, torch.bfloat16, "cuda")
        got = decode_attention(q, k, v, *index, page, 128**-0.5, max_seq_len=1024)
        rel = float((got.float() - want).abs().max() / want.abs().max())
        assert got.dtype == torch.bfloat16 and rel < 2**-6, (
            f"page {page}, contexts {lens}: {rel:.2e}"
        )
        # from qkv: against torch_ops' norms, RoPE and store (float32), then the same kernel
        args, (q_ref, k_ref, v_ref) = qkv_decode_case(page, lens, 16, 8, 128, True, k, v, index)
        want = decode_attention(
            q_ref, k_ref, v_ref, *index, page, 128**-0.5, max_seq_len=1024
        ).float()
        got = decode_attention_qkv(*args, *index, page, 128**-0.5, 1024, 16)
        rel = float((got.float() - want).abs().max() / want.abs().max())
        assert rel < 2**-6, f"from qkv, page {page}, contexts {lens}: {rel:.2e}"
        for got, want in zip(args[6:8], (k_ref, v_ref)):
            assert float((got.float() - want.float()).abs().max()) <= 2**-6 * float(
                want.float().abs().max()
            )


def _gpu_engine(page_size: int, graphs: int = 0):
    from minisgl.engine import Engine, EngineConfig

    path = next((p for p in (SHAPED, SMOLLM2) if (p / "config.json").is_file()), None)
    if path is None:
        pytest.skip("no bf16 model built: python -m tools.models qwen3-0.6b-shaped")
    return path, Engine(
        EngineConfig(
            str(path),
            dtype=torch.bfloat16,
            device="cuda",
            page_size=page_size,
            max_running_req=4,
            num_page_override=2048 // page_size,
            max_seq_len_override=256,
            cuda_graph_max_bs=graphs,
        )
    )


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("n_prompts", [1, 2])
def test_the_engine_on_the_fused_path_gives_the_unfused_logits(page_size, n_prompts, monkeypatch):
    """Teacher-forced: the unfused run's tokens are fed to the fused one. Same tolerance as
    FlashInfer against the torch backend (chapter 17): 2 % of each step's logit range."""
    from minisgl.env import ENV
    from minisgl.kernel import triton_decode, triton_fused

    path, engine = _gpu_engine(page_size)
    monkeypatch.setattr(ENV.DISABLE_FUSED_DECODE, "value", True)
    tokens, plain = _logits(engine, path, n_prompts)
    monkeypatch.setattr(ENV.DISABLE_FUSED_DECODE, "value", False)
    qk_calls = _count_calls(monkeypatch, triton_fused, "qk_norm_rope_store")
    attention_calls = _count_calls(monkeypatch, triton_decode, "decode_attention_qkv")
    _, fused = _logits(engine, path, n_prompts, forced=tokens)
    # the split-KV kernel does the q/k norms, RoPE and the store: no separate kernel for them
    assert len(attention_calls) == (STEPS - 1) * len(engine.model.model.layers) and not qk_calls
    for step, (a, b) in enumerate(zip(fused, plain)):
        diff, scale = float((a - b).abs().max()), float(b.max() - b.min())
        assert diff <= 0.02 * scale, (
            f"step {step}: max |fused - unfused| {diff:.3f} > 2% of {scale:.2f}"
        )
    engine.shutdown()


@pytest.mark.gpu
def test_the_fused_path_replays_in_a_cuda_graph():
    """Graphs of batch 1 and 2 are captured on the fused path: greedy tokens with the graph
    equal the eager ones, and the residual stream updated in place survives replay."""
    path, engine = _gpu_engine(page_size=16, graphs=2)
    assert engine.graph_runner.graph_bs == [1, 2]
    backend, graph_plans = engine.attn_backend, []
    real_plan = backend._plan
    backend._plan = lambda meta: (
        graph_plans.append(meta.wrapper in backend.graph_wrappers.values()) or real_plan(meta)
    )
    for n in (1, 2):
        ids = [hf_encode(path, p) for p in PROMPTS[:n]]
        eager, _ = manual.greedy(engine, manual.place(engine, ids, 16), 16, use_graph=False)
        graph, _ = manual.greedy(engine, manual.place(engine, ids, 16), 16, use_graph=True)
        assert graph == eager, f"{n} prompt(s)"
    # a replay on the split-KV kernel only copies the index into the graph's buffers: the
    # prefills planned FlashInfer's prefill wrapper, no replay planned a decode wrapper
    assert graph_plans and not any(graph_plans), graph_plans
    engine.shutdown()
