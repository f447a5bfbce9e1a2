"""Chapter 19: the fused decode path of up to four requests (``models/fused_decode.py``).

The fused path must give the unfused path's logits: on the CPU through the torch references
(``torch_fused``), and in a subprocess under ``TRITON_INTERPRET=1`` through the Triton kernels
themselves, on the torch backend and on the split-KV one, in float32, where the only
difference is the order of sums. The fused kernels are also compared one by one with their
references, compiled for Hopper to check their PDL instructions and timeline stamps, and on
a GPU: the kernels at Qwen3-0.6B's shapes in bf16, and the engine's logits with the path on
and off (``MINISGL_DISABLE_FUSED_DECODE``), within the tolerance chapter 17 uses for
FlashInfer against the torch backend.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
import torch

from minisgl import kernel
from minisgl.benchmark import manual
from minisgl.kernel import torch_fused, torch_ops
from minisgl.kernel.speedups import FUSED_DECODE_MAX_BS
from minisgl.models import fused_decode
from tests.helpers import MODELS, SMOLLM2, hf_encode
from tests.helpers.interpreter import interpret

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(
    not HAS_TRITON, reason="triton is not installed (pip install triton)"
)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at", "Once upon a time"]
STEPS = 4  # a prefill (unfused) and three fused decode steps


def cpu_engine(path, **overrides):
    from minisgl.engine import Engine, EngineConfig

    config = dict(dtype=torch.float32, device="cpu", max_running_req=4, num_page_override=64,
                  max_seq_len_override=32)  # fmt: skip
    return Engine(EngineConfig(str(path), **{**config, **overrides}))


def logits_of(engine, path, n_prompts, forced=None):
    ids = [hf_encode(path, p) for p in PROMPTS[:n_prompts]]
    reqs = manual.place(engine, ids, STEPS)
    return manual.greedy(engine, reqs, STEPS, use_graph=False, forced=forced)


def count_calls(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


def count_kernel_calls(op: str, calls: list, device: str = "cpu") -> None:
    """Append the function's name to ``calls`` at every call of ``op``'s Triton kernel on
    ``device`` (where Triton runs: the kernel table loads it first)."""
    assert kernel.has_kernel(op, "triton", torch.zeros(1, device=device))

    def counting(f):
        return lambda *a, **kw: calls.append(f.__name__) or f(*a, **kw)

    kernel.OPS[op] = [
        replace(i, function=counting(i.function)) if i.library == "triton" else i
        for i in kernel.OPS[op]
    ]


def fused_on_any_dtype(monkeypatch):
    """Let the fused path take float32 decode batches (it takes fp16/bf16 only)."""

    def takes(model, batch):
        return batch.is_decode and batch.padded_size <= FUSED_DECODE_MAX_BS

    monkeypatch.setattr(fused_decode, "takes", takes)


# --------------------------------------------------------------------------- CPU


def test_the_engine_keeps_the_unfused_model_where_the_fused_kernels_do_not_run(qwen3_path):
    engine = cpu_engine(qwen3_path)
    assert not kernel.has_kernel("norm_linear", "triton", torch.device("cpu"))
    assert not isinstance(engine.model, fused_decode.FusedDecodeLM)
    engine.shutdown()


@pytest.mark.parametrize("model", ["qwen3_path", "qwen2_path"])  # QK-norm; qkv bias
@pytest.mark.parametrize("n_prompts", [1, 2, 4])
def test_the_fused_path_gives_the_unfused_logits(model, n_prompts, request, monkeypatch):
    from minisgl.attention.torch_backend import TorchAttnBackend

    path = request.getfixturevalue(model)
    engine = cpu_engine(path)
    tokens, plain = logits_of(engine, path, n_prompts)
    engine.model = fused_decode.FusedDecodeLM(engine.model)
    fused_on_any_dtype(monkeypatch)
    gemvs = count_calls(monkeypatch, fused_decode, "norm_linear")
    attends = count_calls(monkeypatch, TorchAttnBackend, "forward")
    fused_tokens, fused = logits_of(engine, path, n_prompts, forced=tokens)
    layers = len(engine.model.model.layers)
    assert len(gemvs) == (STEPS - 1) * 2 * layers  # every decode step, both sublayers, no prefill
    assert len(attends) == STEPS * layers  # the layer's own attention, on this backend
    for step, (a, b) in enumerate(zip(fused, plain)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=lambda m: f"step {step}: {m}")
    assert [row.tolist() for row in torch.stack(fused, 1).argmax(-1)] == tokens
    engine.shutdown()


def test_the_wrapper_is_the_model_for_everything_but_forward(qwen3_path):
    engine = cpu_engine(qwen3_path)
    model = engine.model
    wrapped = fused_decode.FusedDecodeLM(model)
    assert wrapped.model is model.model and wrapped.lm_head is model.lm_head
    assert wrapped.state_dict().keys() == model.state_dict().keys()
    layer = next(iter(model.model.layers))
    dense, layer.mlp = layer.mlp, torch.nn.Identity()  # a layer without a dense MLP (MoE, say)
    try:
        with pytest.raises(ValueError):
            fused_decode.FusedDecodeLM(model)
    finally:
        layer.mlp = dense
    engine.shutdown()


def test_the_references_are_the_unfused_ops():
    torch.manual_seed(0)
    x, w, nw, r = torch.randn(2, 16), torch.randn(12, 16), torch.randn(16), torch.randn(2, 12)
    normed = torch_ops.rms_norm(x, nw, 1e-6)
    assert torch.equal(torch_fused.norm_linear(x, nw, 1e-6, w), normed @ w.T)
    gate, up = (normed @ w.T).chunk(2, dim=-1)
    swiglu = torch_fused.norm_linear(x, nw, 1e-6, w, swiglu=True)
    assert torch.equal(swiglu, torch.nn.functional.silu(gate) * up)
    assert torch.equal(torch_fused.norm_lm_head(x, nw, 1e-6, w), normed @ w.T)
    expect = r + x @ w.T
    assert torch.equal(torch_fused.linear_add_residual_(x, w, r, None), expect)
    assert torch.equal(r, expect)  # in place


@needs_triton
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_every_qwen3_gemv_reads_its_whole_row_before_the_pdl_wait(m):
    """The tile rule: one tile covers all of K (the loads before ``gdc_wait``), without more
    accumulators per thread than the registers hold, nor more than 16 KiB of weights per
    program; the rows per program chapter 19 reports."""
    from minisgl.kernel.triton import fused as tf

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
        assert cfg.block_n * k * (2 if swiglu else 1) <= tf.MAX_TILE_WEIGHTS
        assert n // cfg.block_n >= tf.MIN_PROGRAMS
        rows.append(cfg.block_n)
    assert rows == [8, 4, 4, 2], rows  # qkv, gate/up, o, down
    wide = tf.fused_gemv_config(
        m, 1024, 14336
    )  # K past MAX_BLOCK_K: several tiles, still in budget
    assert wide.block_k == tf.MAX_BLOCK_K


# the batch-1 kernels' argument types as the engine launches them, and Qwen3-0.6B's split-KV constants
_BF, _I32, _F32, _I64P = "*bf16", "i32", "fp32", "*i64"
GEMV_TYPES = dict(x_ptr=_BF, w_ptr=_BF, bias_ptr=_BF, norm_w_ptr=_BF, res_ptr=_BF, out_ptr=_BF,
                  stamps_ptr=_I64P, M=_I32, N=_I32, stride_xm=_I32, stride_wn=_I32, stride_rm=_I32,
                  stride_om=_I32, eps=_F32)  # fmt: skip
PARTIAL_TYPES = dict(q_ptr=_BF, k_ptr=_BF, v_ptr=_BF, indptr_ptr="*i32", page_ids_ptr="*i32",
                     last_len_ptr="*i32", part_o_ptr="*fp32", part_lse_ptr="*fp32", pos_ptr="*i64",
                     loc_ptr="*i32", cos_sin_ptr="*fp32", q_norm_ptr=_BF, k_norm_ptr=_BF,
                     stamps_ptr=_I64P, sm_scale=_F32, stride_slot=_I32, num_splits=_I32,
                     stride_q=_I32, eps=_F32)  # fmt: skip
PARTIAL_QWEN3 = dict(MAX_ITERS=1, GROUP=2, BLOCK_G=16, HEAD_DIM=128, NUM_KV_HEADS=8, PAGE=256,
                     BLOCK_T=64, PDL=True, HAS_QK_NORM=True, FROM_QKV=True)  # fmt: skip
MERGE_TYPES = dict(part_o_ptr="*fp32", part_lse_ptr="*fp32", out_ptr=_BF, indptr_ptr="*i32",
                   last_len_ptr="*i32", stamps_ptr=_I64P, num_splits=_I32)  # fmt: skip
MERGE_QWEN3 = dict(
    NUM_QO_HEADS=16, HEAD_DIM=128, PAGE=256, BLOCK_T=64, BLOCK_S=64, BLOCK_D=32, PDL=True
)


def ptx_for_hopper(kernel_fn, types: dict, constexprs: dict, num_warps: int = 4, aligned=()) -> str:
    """``kernel_fn`` compiled for sm_90 (an H100/H200) by Triton's compiler and its bundled
    ptxas, on this machine, GPU or not; returns the PTX. Arguments not in ``types`` are
    constexprs; those in ``aligned`` are known multiples of 16 (as Triton specialises a
    launch whose pointers and strides are), without which it cannot vectorise their loads."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {name: types.get(name, "constexpr") for name in kernel_fn.arg_names}
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(kernel_fn.arg_names)
        if name in aligned
    }
    source = ASTSource(fn=kernel_fn, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps)
    )
    return compiled.asm["ptx"]


@needs_triton
@pytest.mark.parametrize("timeline", [False, True])
def test_the_batch_1_kernels_compile_for_hopper_with_pdl(timeline):
    """The interpreter runs the kernels' logic on the CPU but not the GPU compiler: this
    compiles each one for sm_90 at Qwen3-0.6B's shapes (and SmolLM2's o_proj), as the engine
    launches them, and checks the PTX waits for the kernel before and lets the next one
    start; with ``TIMELINE`` each program also reads the global timer (start, wait, end)."""
    from minisgl.kernel.triton import decode as td
    from minisgl.kernel.triton import fused as tf

    ptx = []
    for m, n, k, norm, swiglu in ((1, 4096, 1024, True, False), (1, 3072, 1024, True, True),
                                  (1, 1024, 2048, False, False), (2, 1024, 3072, False, False),
                                  (1, 576, 576, False, False)):  # fmt: skip
        cfg = tf.fused_gemv_config(m, n, k, swiglu)
        constexprs = dict(K=k, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                          NORM=norm, SWIGLU=swiglu, ADD_RESIDUAL=not norm, HAS_BIAS=False,
                          PDL=True, TIMELINE=timeline)  # fmt: skip
        ptx.append(ptx_for_hopper(tf._fused_gemv_kernel, GEMV_TYPES, constexprs, cfg.num_warps))
    assert PARTIAL_QWEN3["BLOCK_T"] == td.BLOCK_T and MERGE_QWEN3["BLOCK_D"] == td.MERGE_BLOCK_D
    for from_qkv in (False, True):
        constexprs = dict(PARTIAL_QWEN3, FROM_QKV=from_qkv, TIMELINE=timeline)
        ptx.append(
            ptx_for_hopper(td._decode_partial_kernel, PARTIAL_TYPES, constexprs, td.NUM_WARPS)
        )
    merge = dict(MERGE_QWEN3, TIMELINE=timeline)
    ptx.append(ptx_for_hopper(td._decode_merge_kernel, MERGE_TYPES, merge, td.MERGE_WARPS))
    for code in ptx:
        assert "griddepcontrol.wait" in code and "griddepcontrol.launch_dependents" in code
        assert (code.count("%globaltimer") >= 3) == timeline


@needs_triton
def test_the_lm_head_grid_covers_the_vocabulary_two_programs_per_sm(monkeypatch):
    from minisgl.kernel.triton import lm_head as tlh

    for n, sms in ((151936, 132), (49152, 132), (100, 132), (8, 4)):
        cfg = tlh.lm_head_config(n, sms)
        tiles = -(-n // cfg.block_n)
        assert cfg.programs <= tlh.LM_HEAD_PROGRAMS_PER_SM * sms and cfg.programs <= tiles
        assert cfg.programs * (cfg.iters - 1) < tiles <= cfg.programs * cfg.iters  # every tile once
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
    # a hidden size the kernel does not take stays on the torch reference where Triton runs too;
    # the kernels are imported first: made under the variable they would stay interpreted
    # for every later test of the session
    from minisgl.kernel import triton as kernel_triton

    kernel_triton.load()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    wide = torch.randn(1, 5000), torch.ones(5000), 1e-6, torch.randn(8, 5000)
    assert kernel.library_for("norm_lm_head", *wide) == "torch"
    assert kernel.library_for("norm_lm_head", x, torch.ones(16), 1e-6, w) == "triton"


@needs_triton
def test_the_lm_head_kernel_compiles_for_hopper_with_its_pipeline():
    """As the engine launches it on an H200 at Qwen3-0.6B's shapes: Triton's software
    pipeline turns the loop's loads into asynchronous copies, and the kernel, launched
    without PDL, has no PDL wait or trigger."""
    from minisgl.kernel.triton import lm_head as tlh

    cfg = tlh.lm_head_config(151936, 132)
    types = dict(x_ptr=_BF, norm_w_ptr=_BF, w_ptr=_BF, out_ptr=_BF, M=_I32, N=_I32,
                 stride_xm=_I32, stride_wn=_I32, stride_om=_I32, eps=_F32)  # fmt: skip
    constexprs = dict(K=1024, BLOCK_M=1, BLOCK_N=cfg.block_n, BLOCK_K=1024, ITERS=cfg.iters,
                      STAGES=cfg.stages)  # fmt: skip
    aligned = ("x_ptr", "norm_w_ptr", "w_ptr", "out_ptr", "stride_wn")
    ptx = ptx_for_hopper(tlh._norm_lm_head_kernel, types, constexprs, cfg.num_warps, aligned)
    assert "cp.async.cg.shared.global" in ptx and "griddepcontrol" not in ptx


@needs_triton
def test_the_kernel_chain_benchmark_compiles_for_hopper():
    """``minisgl.benchmark.kernel_chain`` runs on a GPU only: its link kernel must carry PDL's
    wait and trigger, and its persistent kernel the atomics of its grid barrier."""
    from minisgl.benchmark import kernel_chain

    link_types = dict(x_ptr="*bf16", y_ptr="*bf16")
    link = ptx_for_hopper(kernel_chain._link_kernel, link_types, dict(K=1024, PDL=True))
    assert "griddepcontrol.wait" in link and "griddepcontrol.launch_dependents" in link
    types = dict(x_ptr="*bf16", counter_ptr="*i32", num_programs="i32")
    barrier = ptx_for_hopper(kernel_chain._persistent_kernel, types, dict(STEPS=3, K=2048, PER=8))
    assert "atom.global.gpu.acq_rel.add" in barrier


def test_the_layer_timeline_reads_its_stamps_as_documented():
    """``layer_timeline``'s arithmetic on made-up stamps of two programs per launch: the
    columns of its table and one layer's kernels for the figure."""
    from minisgl.benchmark import layer_timeline as lt

    kernels, layers, base = len(lt.KERNELS), 5, 1_800_000_000_000_000_000  # ns since 1970
    buffers = []
    for layer in range(layers):
        launches = {}
        for j, name in enumerate(lt.KERNELS):
            t0 = base + 10_000 * (layer * kernels + j)  # each launch starts 10 us after the last
            stamps = torch.zeros(4, 4, dtype=torch.int64)  # two programs ran, two rows unused
            stamps[0] = torch.tensor([t0, t0 + 2_000, t0 + 9_000, 0])
            stamps[1] = torch.tensor([t0 + 1_000, t0 + 3_000, t0 + 10_000, 1])
            launches[name] = stamps
        buffers.append(launches)
    times = lt.kernel_times(buffers)
    assert times[1]["start_first"] == 10.0 and times[1]["wait_last"] == 13.0
    row = lt.table(times)["attn"]
    assert row == dict(starts=1.0, boundary=2.0, spread=1.0, after=7.0, total=10.0)
    layer = lt.one_layer(times, 2)
    assert [k["name"] for k in layer] == list(lt.KERNELS)
    assert layer[0]["start_first"] == 0.0 and layer[-1]["end_last"] == 60.0


@needs_triton
def test_the_fused_kernels_refuse_bad_input_before_launching():
    """Checked on the host, so a wrong call is a ValueError, never an out-of-bounds kernel."""
    from minisgl.kernel.triton import fused as tf

    x, w = torch.randn(1, 16), torch.randn(8, 16)
    for call in (
        lambda: tf.norm_gemv(x, torch.ones(16), 1e-6, w, torch.zeros(8, dtype=torch.bfloat16)),
        lambda: tf.norm_gemv(x, torch.ones(16), 1e-6, torch.randn(7, 16), swiglu=True),  # odd
        lambda: tf.norm_gemv(x.int(), torch.ones(16), 1e-6, w.int()),  # integers
        lambda: tf.norm_gemv(x, torch.ones(8), 1e-6, w),  # a norm of another width
        lambda: tf.gemv_add_residual_(x, w, torch.randn(4, 8)),  # residual of another shape
        lambda: tf.gemv_add_residual_(x, w, torch.randn(1, 16)[:, ::2]),  # rows not contiguous
        lambda: tf.norm_gemv(x, torch.ones(16), 1e-6, w, stamps=torch.zeros(8, 4)),  # float stamps
        lambda: tf.gemv_add_residual_(x, w, torch.randn(1, 8), stamps=torch.zeros(0, 4).long()),
    ):
        with pytest.raises(ValueError):
            call()


KERNEL_SCRIPT = """
import torch
from minisgl.kernel import torch_fused
from minisgl.kernel.triton import fused as tf, lm_head as tlh

def check(got, ref, what, tol):
    err = float((got.float() - ref.float()).abs().max())
    scale = float(ref.float().abs().max())
    assert err <= tol * scale, f"{what}: max |diff| {err:.3g} > {tol} x {scale:.3g}"

torch.manual_seed(0)
for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 4e-2)):  # bf16: a few roundings
    for m in (1, 2, 3):  # 3: a tile of 4 rows, the last masked off
        # one masked tile; three 1,024-wide tiles, the last masked; one 4,096-wide tile
        for n, k, tiles in ((8, 40, None), (12, 3000, (4, 1024)), (6, 4096, None)):
            cfg = tf.FusedGemvConfig(4 if m > 2 else 2, *tiles, 4) if tiles else None
            x, xr = torch.randn(m, k), torch.randn(m, k)
            w, nw = torch.randn(n, k) / k ** 0.5, 1 + 0.1 * torch.randn(k)
            b, r = torch.randn(n), torch.randn(m, n)
            for bias in (None, b):
                args = [t.to(dtype) if t is not None else None for t in (x, nw, w, bias)]
                ref = [t.float() if t is not None else None for t in args]  # same inputs, float32 math
                what = f"{dtype} M={m} N={n} K={k} bias={bias is not None}"
                check(tf.norm_gemv(args[0], args[1], 1e-6, args[2], args[3], config=cfg),
                      torch_fused.norm_linear(*ref[:2], 1e-6, *ref[2:]), "norm_gemv " + what, tol)
                check(tf.norm_gemv(args[0], args[1], 1e-6, args[2], args[3], swiglu=True, config=cfg),
                      torch_fused.norm_linear(*ref[:2], 1e-6, *ref[2:], swiglu=True), "swiglu " + what, tol)
                res = r.to(dtype)
                out = tf.gemv_add_residual_(xr.to(dtype), args[2], res, args[3], config=cfg)
                assert out is res
                want = torch_fused.linear_add_residual_(xr.to(dtype).float(), ref[2], r.to(dtype).float(), ref[3])
                check(res, want, "add_residual " + what, tol)
    # the LM head (2 programs per SM, 4 SMs in the interpreter): 8 programs over 13 tiles of 8 rows (the
    # last tile masked, three programs' second turn empty), 5 programs over 5 tiles
    for m in (1, 2, 3):
        for n, k in ((100, 64), (37, 40)):
            x, nw, w = torch.randn(m, k).to(dtype), (1 + 0.1 * torch.randn(k)).to(dtype), torch.randn(n, k).to(dtype)
            check(tlh.norm_lm_head(x, nw, 1e-6, w), torch_fused.norm_lm_head(x.float(), nw.float(), 1e-6, w.float()),
                  f"norm_lm_head {dtype} M={m} N={n} K={k}", tol)
print("kernels ok")
"""

MODEL_SCRIPT = """
import sys, torch
from minisgl import kernel
from minisgl.kernel.triton import fused as tf, lm_head as tlh
from minisgl.models import fused_decode
from tests.test_ch19_fused import count_kernel_calls, cpu_engine, logits_of

path = sys.argv[1]
# wide tiles, so the interpreter runs a few programs, not hundreds (the kernel test runs the real tiles)
tf.fused_gemv_config = lambda m, n, k, swiglu=False: tf.FusedGemvConfig(2, 64, 64, 4)
tlh.lm_head_config = lambda n, sms: tlh.LMHeadConfig(4, 1024, -(-n // 4096), 4, 1)
takes = fused_decode.takes
calls = []
for op in ("norm_linear", "linear_add_residual_", "norm_lm_head", "decode_attention_qkv"):
    count_kernel_calls(op, calls)
assert kernel.library_for("norm_linear", torch.zeros(1, 8), torch.ones(8), 1e-6, torch.zeros(4, 8)) == "triton"

for backend in ("torch", "split_kv"):
    fused_decode.takes = takes  # float32: unfused
    engine = cpu_engine(path, attention_backend=backend)
    assert isinstance(engine.model, fused_decode.FusedDecodeLM)  # Triton runs: the engine wraps
    tokens, plain = logits_of(engine, path, 2)
    fused_decode.takes = lambda model, batch: batch.is_decode and batch.padded_size <= 2
    calls.clear()
    _, fused = logits_of(engine, path, 2, forced=tokens)
    layers = len(engine.model.model.layers)
    attention = 1 if backend == "split_kv" else 0  # from qkv, on the split-KV backend
    assert calls.count("decode_attention_qkv") == attention * layers * 3, (backend, calls)
    assert len(calls) == ((4 + attention) * layers + 1) * 3, (backend, len(calls))  # three decode steps
    for step, (a, b) in enumerate(zip(fused, plain)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=lambda m: f"{backend}, step {step}: {m}")
    engine.shutdown()
print("model ok")
"""


@needs_triton
@pytest.mark.slow
def test_fused_kernels_match_their_references_in_the_interpreter():
    res = interpret(KERNEL_SCRIPT)
    assert res.returncode == 0 and "kernels ok" in res.stdout, res.stderr[-3000:]


@needs_triton
@pytest.mark.slow
def test_the_model_on_the_fused_triton_kernels_gives_the_unfused_logits(qwen3_path):
    """Both attention backends: the torch one (the layer's own attention) and the split-KV one
    (the kernel from qkv), each against its own unfused run."""
    res = interpret(MODEL_SCRIPT, str(qwen3_path))
    assert res.returncode == 0 and "model ok" in res.stdout, res.stderr[-3000:]


# --------------------------------------------------------------------------- GPU

SHAPED = MODELS / "qwen3-0.6b-shaped"
QWEN3_LAYER = dict(hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072)


def gpu_engine(page_size: int, graphs: int = 0):
    from minisgl.engine import Engine, EngineConfig

    path = next((p for p in (SHAPED, SMOLLM2) if (p / "config.json").is_file()), None)
    if path is None:
        pytest.skip("no bf16 model built: python -m tools.models qwen3-0.6b-shaped")
    config = EngineConfig(str(path), dtype=torch.bfloat16, device="cuda", page_size=page_size,
                          max_running_req=4, num_page_override=2048 // page_size,
                          max_seq_len_override=256, cuda_graph_max_bs=graphs)  # fmt: skip
    return path, Engine(config)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_fused_kernels_at_qwen3_shapes_match_float32(m):
    """bf16 kernels against float32 math on the same bf16 inputs: 2**-6 of the largest
    output covers the few roundings the kernels make on purpose; a wrong tile is far off."""
    from minisgl.kernel.triton import fused as tf
    from minisgl.kernel.triton.lm_head import norm_lm_head

    c, dev, bf = QWEN3_LAYER, "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(m)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device=dev, generator=gen) * scale).to(bf)

    h, i = c["hidden"], c["intermediate"]
    x, nw = rand(m, h), 1 + rand(h, scale=0.1)
    f32 = lambda *ts: [t.float() for t in ts]  # noqa: E731
    w_qkv, w_gate_up = rand(4096, h, scale=h**-0.5), rand(2 * i, h, scale=h**-0.5)
    w_vocab = rand(151936, h, scale=h**-0.5)  # Qwen3's vocabulary: the persistent LM head
    cases = {
        "qkv": (
            tf.norm_gemv(x, nw, 1e-6, w_qkv),
            torch_fused.norm_linear(*f32(x, nw), 1e-6, w_qkv.float()),
        ),
        "gate_up": (
            tf.norm_gemv(x, nw, 1e-6, w_gate_up, swiglu=True),
            torch_fused.norm_linear(*f32(x, nw), 1e-6, w_gate_up.float(), swiglu=True),
        ),
        "lm_head": (
            norm_lm_head(x, nw, 1e-6, w_vocab),
            torch_fused.norm_lm_head(*f32(x, nw), 1e-6, w_vocab.float()),
        ),
    }
    for name, (n, k) in {"o": (h, 2048), "down": (h, i)}.items():
        a, w, r = rand(m, k), rand(n, k, scale=k**-0.5), rand(m, n)
        want = torch_fused.linear_add_residual_(*f32(a, w, r))
        cases[name] = (tf.gemv_add_residual_(a, w, r), want)
    for name, (got, want) in cases.items():
        assert got.dtype == bf and got.shape == want.shape, name
        rel = float((got.float() - want).abs().max() / want.abs().max())
        assert rel < 2**-6, f"{name} M={m}: max |fused - fp32| / max |fp32| = {rel:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("n_prompts", [1, 2, 4])
def test_the_engine_on_the_fused_path_gives_the_unfused_logits(page_size, n_prompts, monkeypatch):
    """Teacher-forced: the unfused run's tokens are fed to the fused one. Same tolerance as
    FlashInfer against the torch backend (chapter 17): 2 % of each step's logit range."""
    from minisgl.attention import split_kv
    from minisgl.kernel import speedups

    path, engine = gpu_engine(page_size)
    assert isinstance(engine.model, fused_decode.FusedDecodeLM)
    with speedups.using(fused_decode=False):
        tokens, plain = logits_of(engine, path, n_prompts)
    attention_calls = count_calls(monkeypatch, split_kv, "decode_attention_qkv")
    _, fused = logits_of(engine, path, n_prompts, forced=tokens)
    # the split-KV kernel does the q/k norms, RoPE and the store from qkv, in every layer
    assert n_prompts <= FUSED_DECODE_MAX_BS
    assert len(attention_calls) == (STEPS - 1) * len(engine.model.model.layers)
    for step, (a, b) in enumerate(zip(fused, plain)):
        diff, scale = float((a - b).abs().max()), float(b.max() - b.min())
        assert diff <= 0.02 * scale, (
            f"step {step}: max |fused - unfused| {diff:.3f} > 2% of {scale:.2f}"
        )
    engine.shutdown()


@pytest.mark.gpu
def test_the_fused_path_replays_in_a_cuda_graph():
    """Graphs of batch 1 and 2 are captured on the fused path: greedy tokens with the graph
    equal the eager ones, and the residual stream updated in place survives replay. Their
    replays copy the split-KV index into the graph's buffers: FlashInfer never plans a
    decode for them."""
    path, engine = gpu_engine(page_size=16, graphs=2)
    assert engine.graph_runner.graph_bs == [1, 2]
    flashinfer, plans = engine.attn_backend.fallback, []
    real_plan = flashinfer._plan
    flashinfer._plan = lambda meta: plans.append(meta.wrapper) or real_plan(meta)
    for n in (1, 2):
        ids = [hf_encode(path, p) for p in PROMPTS[:n]]
        eager, _ = manual.greedy(engine, manual.place(engine, ids, 16), 16, use_graph=False)
        graph, _ = manual.greedy(engine, manual.place(engine, ids, 16), 16, use_graph=True)
        assert graph == eager, f"{n} prompt(s)"
    assert not flashinfer.graph_wrappers  # no decode graph of FlashInfer's was captured
    assert plans and all(wrapper is flashinfer.prefill_wrapper for wrapper in plans)
    engine.shutdown()
