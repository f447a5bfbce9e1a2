"""Chapter 19: the KV store, the embedding gather and the small-batch GEMV as Triton kernels.

The store and the gather copy rows, so they must match the torch references bit for bit.
The GEMV sums products in another order than ``F.linear``, so it is compared with a
stated tolerance. On the CPU the Triton kernels run under Triton's interpreter
(``TRITON_INTERPRET=1``, in a subprocess because the variable is read at import) when
``triton`` is installed; on a GPU they are compiled, compared on realistic shapes (the
GEMV at Qwen3-0.6B's) and timed against the references.
"""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch
import torch.nn.functional as F

from minisgl import kernel
from minisgl.kernel import torch_ops
from tests.helpers.interpreter import interpret

HAS_TRITON = importlib.util.find_spec("triton") is not None


def _store_case(
    device: str, dtype: torch.dtype, num_tokens: int, heads: int, dim: int, slots: int, idx_dtype
):
    """A fused-qkv output (k, v are strided views of it, as in the model) and a pool."""
    gen = torch.Generator().manual_seed(num_tokens)
    qkv = torch.randn(num_tokens, (4 + 2 * heads) * dim, generator=gen).to(
        device=device, dtype=dtype
    )
    k = qkv[:, 4 * dim : (4 + heads) * dim].reshape(num_tokens, heads, dim)
    v = qkv[:, (4 + heads) * dim :].reshape(num_tokens, heads, dim)
    loc = torch.randperm(slots, generator=gen)[:num_tokens].to(device=device, dtype=idx_dtype)
    pool = [torch.zeros(slots, heads, dim, device=device, dtype=dtype) for _ in range(2)]
    return k, v, loc, pool


def test_the_reference_store_scatters_rows():
    k, v, loc, (kc, vc) = _store_case("cpu", torch.float32, 5, 2, 8, 16, torch.int64)
    torch_ops.store_cache(kc, vc, loc, k, v)
    assert torch.equal(kc[loc], k) and torch.equal(vc[loc], v)
    untouched = torch.ones(16, dtype=torch.bool)
    untouched[loc] = False
    assert not kc[untouched].any()


@pytest.mark.skipif(
    not HAS_TRITON, reason="triton is not installed (pip install triton) for the interpreter test"
)
def test_triton_kernels_match_the_reference_in_the_interpreter():
    script = textwrap.dedent(
        """
        import torch
        from minisgl.kernel import torch_ops
        from minisgl.kernel.triton import store as triton_store
        from test_ch19_kernels import _store_case
        for dtype in (torch.float32, torch.bfloat16):
            for idx in (torch.int32, torch.int64):
                k, v, loc, (kc, vc) = _store_case("cpu", dtype, 7, 2, 24, 40, idx)
                kr, vr = kc.clone(), vc.clone()
                triton_store.store_cache(kc, vc, loc, k, v)
                torch_ops.store_cache(kr, vr, loc.long(), k, v)
                assert torch.equal(kc, kr) and torch.equal(vc, vr), (dtype, idx)
        for hidden in (72, 5000):  # one block; two blocks of 4096
            w = torch.randn(50, hidden)
            ids = torch.randint(0, 50, (9,), dtype=torch.int32)
            assert torch.equal(triton_store.embedding_gather(ids, w), torch_ops.embedding_gather(ids.long(), w))
        print("interpreter ok")
        """
    )
    res = interpret(script, timeout=300)
    assert res.returncode == 0 and "interpreter ok" in res.stdout, res.stderr[-3000:]


# The GEMV's shapes: Qwen3-0.6B's five linear layers (N, K), then their halves at TP=2.
QWEN3_LINEARS = {
    "lm_head": (151936, 1024),
    "qkv_proj": (4096, 1024),
    "o_proj": (1024, 2048),
    "gate_up_proj": (6144, 1024),
    "down_proj": (1024, 3072),
}
QWEN3_LINEARS_TP2 = {
    "lm_head": (75968, 1024),
    "qkv_proj": (2048, 1024),
    "o_proj": (1024, 1024),
    "gate_up_proj": (3072, 1024),
    "down_proj": (1024, 1536),
}


def _gemv_case(
    m: int, n: int, k: int, bias: bool, dtype: torch.dtype = torch.float32, device: str = "cpu"
):
    """``x: [m, k]``, ``weight: [n, k]`` scaled by ``1/sqrt(k)`` (outputs of order 1), ``bias``."""
    gen = torch.Generator().manual_seed(1000 * m + n + k)
    x = torch.randn(m, k, generator=gen)
    w = torch.randn(n, k, generator=gen) / k**0.5
    b = torch.randn(n, generator=gen) if bias else None
    return [None if t is None else t.to(device=device, dtype=dtype) for t in (x, w, b)]


def _rel_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|, after checking shapes."""
    assert tuple(got.shape) == tuple(want.shape), (
        f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    )
    return float((got.double() - want.double()).abs().max() / want.double().abs().max())


@pytest.mark.skipif(
    not HAS_TRITON, reason="triton is not installed (pip install triton) for the interpreter test"
)
@pytest.mark.slow
def test_gemv_matches_f_linear_in_the_interpreter():
    # float32: both sides sum K <= 200 float32 products, in different orders, so they differ
    # by a few units of 2**-24 relative; 1e-5 of the largest output leaves a margin of ~20x
    # and catches any indexing or masking slip (those are of order 1). bf16: the
    # interpreter converts float32 to bf16 by truncation (the GPU rounds to nearest), so
    # each output is within 2**-7 of its value, hence 2**-7 of the largest output.
    script = textwrap.dedent(
        """
        import torch
        import torch.nn.functional as F
        from minisgl.kernel.triton.gemv import GemvConfig, gemv
        from test_ch19_kernels import _gemv_case, _rel_diff
        cases = 0
        for n, k in ((96, 64), (1000, 200)):
            for m in (1, 3, 8):
                # the heuristic's tiles at N=96; at N=1000 they would be 250 programs of 4
                # rows, slow to interpret, so 16 of 64 rows (the last one masked)
                cfg = None if n == 96 else GemvConfig(1 << (m - 1).bit_length(), 64, 256, 1, 4)
                for bias in (False, True):
                    x, w, b = _gemv_case(m, n, k, bias)
                    rel = _rel_diff(gemv(x, w, b, config=cfg), F.linear(x, w, b))
                    assert rel < 1e-5, (m, n, k, bias, rel)
                    cases += 1
            # split-K in 3, 8 (fewer once rounded to whole chunks) and 2 parts, the last
            # one ragged at K=200 (with 25 whole chunks of 8 in the last config), tiles with
            # masked tails in N and K, and block_m above M (masked rows)
            for cfg in (GemvConfig(8, 64, 32, 3, 4), GemvConfig(8, 32, 64, 8, 1), GemvConfig(4, 16, 128, 2, 2),
                        GemvConfig(4, 64, 8, 2, 4)):
                x, w, b = _gemv_case(3, n, k, True)
                rel = _rel_diff(gemv(x, w, b, config=cfg), F.linear(x, w, b))
                assert rel < 1e-5, (cfg, n, k, rel)
                cases += 1
        for dtype in (torch.bfloat16, torch.float16):
            x, w, b = _gemv_case(5, 96, 200, True, dtype)
            got = gemv(x, w, b)
            assert got.dtype == dtype
            rel = _rel_diff(got, F.linear(x.float(), w.float(), b.float()))
            assert rel < 2**-7, (dtype, rel)
            cases += 1
        print(f"interpreter ok, {cases} cases")
        """
    )
    res = interpret(script, timeout=600)
    assert res.returncode == 0 and "interpreter ok" in res.stdout, res.stderr[-3000:]


@pytest.mark.skipif(
    not HAS_TRITON, reason="triton is not installed (pip install triton) for the config test"
)
@pytest.mark.parametrize("tp", [1, 2])
def test_gemv_config_fills_the_gpu_at_qwen3_shapes(tp):
    from minisgl.kernel.triton.gemv import ACC_PER_THREAD, MAX_SPLIT_K, PROGRAMS_PER_SM, gemv_config

    sms = 132
    for name, (n, k) in (QWEN3_LINEARS if tp == 1 else QWEN3_LINEARS_TP2).items():
        for m in range(1, 9):  # the kernel serves up to 8 rows, whatever the dispatch sends it
            c = gemv_config(m, n, k, sms)
            assert c == gemv_config(m, n, k, sms), "the heuristic must be deterministic"
            assert c.block_m >= m and c.block_m & (c.block_m - 1) == 0, (name, m, c)
            assert c.block_m * c.block_n * c.block_k <= ACC_PER_THREAD * 32 * c.num_warps, (
                name,
                m,
                c,
            )
            chunks = -(-k // c.block_k)
            per_split = -(-chunks // c.split_k)
            assert (c.split_k - 1) * per_split < chunks <= c.split_k * per_split, (
                f"{name}: an empty K split {c}"
            )
            assert c.split_k <= MAX_SPLIT_K, (name, m, c)
            programs = -(-n // c.block_n) * c.split_k
            assert programs >= PROGRAMS_PER_SM * sms, (
                f"{name} M={m}: {programs} programs for {sms} SMs ({c})"
            )
    with pytest.raises(ValueError):
        gemv_config(0, 1024, 1024)


def test_linear_on_the_cpu_is_f_linear():
    for dtype in (torch.float32, torch.bfloat16):
        for m in (1, 8, 33):
            x, w, b = _gemv_case(m, 96, 64, True, dtype)
            assert kernel.library_for("linear", x, w) == "torch"
            assert torch.equal(kernel.linear(x, w, b), F.linear(x, w, b)), (dtype, m)
            assert torch.equal(kernel.linear(x, w), F.linear(x, w)), (dtype, m)
    x3 = torch.randn(2, 3, 64)  # any leading dims, as F.linear allows
    w = torch.randn(96, 64)
    assert torch.equal(kernel.linear(x3, w), F.linear(x3, w))


# --------------------------------------------------------------------------- GPU


def _time_ms(fn, iters: int = 50) -> float:
    from minisgl.benchmark.common import cuda_time_ms

    return cuda_time_ms(fn, iters)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_triton_store_matches_the_reference(dtype, idx_dtype):
    from minisgl.kernel.triton import store as triton_store

    for tokens, heads, dim in [(1, 8, 128), (37, 3, 64), (4096, 8, 128)]:
        k, v, loc, (kc, vc) = _store_case("cuda", dtype, tokens, heads, dim, 8192, idx_dtype)
        kr, vr = kc.clone(), vc.clone()
        triton_store.store_cache(kc, vc, loc, k, v)
        torch_ops.store_cache(kr, vr, loc.long(), k, v)
        assert torch.equal(kc, kr) and torch.equal(vc, vr), (tokens, heads, dim)


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [576, 1024, 5000])
def test_triton_gather_matches_the_reference(hidden):
    from minisgl.kernel.triton import store as triton_store

    w = torch.randn(151936, hidden, device="cuda", dtype=torch.bfloat16)
    for n in (1, 256, 8192):
        ids = torch.randint(0, 151936, (n,), device="cuda", dtype=torch.int32)
        assert torch.equal(
            triton_store.embedding_gather(ids, w), torch_ops.embedding_gather(ids.long(), w)
        )


@pytest.mark.gpu
def test_kernels_are_timed_against_the_reference(capsys):
    """Not a pass/fail race (timings vary): prints both, fails only if a kernel is far slower."""
    from minisgl.kernel.triton import store as triton_store

    k, v, loc, (kc, vc) = _store_case("cuda", torch.bfloat16, 8192, 8, 128, 65536, torch.int32)
    loc64 = loc.long()
    w = torch.randn(151936, 1024, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 151936, (8192,), device="cuda", dtype=torch.int32)
    rows = [
        (
            "store_kv 8192 x 8 x 128",
            _time_ms(lambda: torch_ops.store_cache(kc, vc, loc64, k, v)),
            _time_ms(lambda: triton_store.store_cache(kc, vc, loc, k, v)),
        ),
        (
            "embedding 8192 x 1024",
            _time_ms(lambda: torch_ops.embedding_gather(ids.long(), w)),
            _time_ms(lambda: triton_store.embedding_gather(ids, w)),
        ),
    ]
    with capsys.disabled():
        for name, ref, ours in rows:
            print(f"\n{name}: torch {ref * 1e3:.1f} us, triton {ours * 1e3:.1f} us")
    for name, ref, ours in rows:
        assert ours < 3 * ref + 0.05, f"{name}: triton {ours:.3f} ms vs torch {ref:.3f} ms"


@pytest.mark.gpu
def test_the_pool_and_the_embedding_use_triton_on_cuda():
    x, w = torch.zeros(4, 8, 16, device="cuda"), torch.zeros(10, 16, device="cuda")
    loc = torch.arange(4, device="cuda")
    assert kernel.library_for("store_cache", x, x, loc, x, x) == "triton"
    assert kernel.library_for("embedding_gather", loc, w) == "triton"


@pytest.mark.gpu
@pytest.mark.parametrize("tp", [1, 2])
def test_gemv_matches_f_linear_at_qwen3_shapes(tp):
    """bf16 on the GPU rounds each output to nearest once (within 2**-8 of it); float32
    sums in another order add far less. 2**-7 of the largest output (about 0.8 %) is
    twice the rounding bound; a wrong tile or mask is off by far more."""
    from minisgl.kernel.triton import gemv as triton_gemv

    for name, (n, k) in (QWEN3_LINEARS if tp == 1 else QWEN3_LINEARS_TP2).items():
        for m in (1, 2, 3, 4, 8):
            x, w, b = _gemv_case(
                m, n, k, name == "qkv_proj", torch.bfloat16, "cuda"
            )  # Qwen2 has a qkv bias
            want = F.linear(x.float(), w.float(), None if b is None else b.float())
            got = triton_gemv.gemv(x, w, b)
            assert got.dtype == torch.bfloat16
            rel = _rel_diff(got, want)
            assert rel < 2**-7, f"{name} M={m}: max |gemv - fp32| / max |fp32| = {rel:.2e}"


@pytest.mark.gpu
def test_linear_sends_small_batches_to_the_gemv():
    from minisgl.kernel import speedups
    from minisgl.kernel.triton.gemv import GEMV_MAX_M

    def library(m, k=2048, n=1024, dtype=torch.bfloat16):
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        return kernel.library_for("linear", x, torch.randn(n, k, device="cuda", dtype=dtype))

    # o_proj (K >= N): the GEMV up to GEMV_MAX_M rows
    assert [library(m) for m in (1, GEMV_MAX_M, GEMV_MAX_M + 1)] == ["triton", "triton", "torch"]
    assert library(1, dtype=torch.float32) == "torch"  # float32 stays with cuBLAS
    assert library(1, k=1024, n=4096) == "torch"  # qkv: cuBLAS streams it well
    with speedups.using(gemv=False):
        assert library(1) == "torch"


@pytest.mark.gpu
def test_gemv_replays_in_a_cuda_graph():
    """Split-K allocates its partial sums at capture; the replay must reuse them correctly."""
    from minisgl.kernel.triton import gemv as triton_gemv

    x, w, _ = _gemv_case(4, 1024, 3072, False, torch.bfloat16, "cuda")  # down_proj: split-K
    assert triton_gemv.gemv_config(4, 1024, 3072).split_k > 1
    eager = triton_gemv.gemv(x, w)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        triton_gemv.gemv(x, w)  # warm-up outside the graph (compiles)
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        out = triton_gemv.gemv(x, w)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, triton_gemv.gemv(x, w)) and not torch.equal(out, eager)


@pytest.mark.gpu
def test_gemv_is_timed_against_cublas(capsys):
    """Not a race either: prints both at batch 1, with the weights read from memory (see
    ``python -m minisgl.benchmark.gemv``), and fails only if the GEMV is more than twice as
    slow plus 5 us."""
    from minisgl.benchmark.gemv import time_gemv

    rows = [
        (name, time_gemv(1, n, k, torch.bfloat16, replays=10))
        for name, (n, k) in QWEN3_LINEARS.items()
    ]
    with capsys.disabled():
        for name, r in rows:
            print(
                f"\n{name} M=1: torch {r['torch_us']:.1f} us ({r['torch_gbps']:.0f} GB/s), "
                f"triton {r['triton_us']:.1f} us ({r['triton_gbps']:.0f} GB/s), {r['config']}"
            )
    for name, r in rows:
        assert r["rel_diff"] < 2**-7, f"{name}: {r['rel_diff']:.2e}"
        assert r["triton_us"] < 2 * r["torch_us"] + 5, (
            f"{name}: triton {r['triton_us']:.1f} us vs torch {r['torch_us']:.1f} us"
        )
