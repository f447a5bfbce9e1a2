"""Chapter 19: the KV store and the embedding gather as Triton kernels.

Both kernels copy rows, so they must match the torch references bit for bit. On the CPU
the Triton kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, in a
subprocess because the variable is read at import) when ``triton`` is installed; on a
GPU they are compiled, compared on realistic shapes and timed against the references.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from minisgl.kernel import torch_ops

from conftest import ROOT

HAS_TRITON = importlib.util.find_spec("triton") is not None


def _store_case(device: str, dtype: torch.dtype, num_tokens: int, heads: int, dim: int, slots: int, idx_dtype):
    """A fused-qkv output (k, v are strided views of it, as in the model) and a pool."""
    gen = torch.Generator().manual_seed(num_tokens)
    qkv = torch.randn(num_tokens, (4 + 2 * heads) * dim, generator=gen).to(device=device, dtype=dtype)
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


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install triton) for the interpreter test")
def test_triton_kernels_match_the_reference_in_the_interpreter():
    script = textwrap.dedent(
        """
        import torch
        from minisgl.kernel import torch_ops, triton_store
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
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    res = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "interpreter ok" in res.stdout, res.stderr[-3000:]


# --------------------------------------------------------------------------- GPU


def _time_ms(fn, iters: int = 50) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_triton_store_matches_the_reference(dtype, idx_dtype):
    from minisgl.kernel import triton_store

    for tokens, heads, dim in [(1, 8, 128), (37, 3, 64), (4096, 8, 128)]:
        k, v, loc, (kc, vc) = _store_case("cuda", dtype, tokens, heads, dim, 8192, idx_dtype)
        kr, vr = kc.clone(), vc.clone()
        triton_store.store_cache(kc, vc, loc, k, v)
        torch_ops.store_cache(kr, vr, loc.long(), k, v)
        assert torch.equal(kc, kr) and torch.equal(vc, vr), (tokens, heads, dim)


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [576, 1024, 5000])
def test_triton_gather_matches_the_reference(hidden):
    from minisgl.kernel import triton_store

    w = torch.randn(151936, hidden, device="cuda", dtype=torch.bfloat16)
    for n in (1, 256, 8192):
        ids = torch.randint(0, 151936, (n,), device="cuda", dtype=torch.int32)
        assert torch.equal(triton_store.embedding_gather(ids, w), torch_ops.embedding_gather(ids.long(), w))


@pytest.mark.gpu
def test_kernels_are_timed_against_the_reference(capsys):
    """Not a pass/fail race (timings vary): prints both, fails only if a kernel is far slower."""
    from minisgl.kernel import triton_store

    k, v, loc, (kc, vc) = _store_case("cuda", torch.bfloat16, 8192, 8, 128, 65536, torch.int32)
    loc64 = loc.long()
    w = torch.randn(151936, 1024, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 151936, (8192,), device="cuda", dtype=torch.int32)
    rows = [
        ("store_kv 8192 x 8 x 128", _time_ms(lambda: torch_ops.store_cache(kc, vc, loc64, k, v)),
         _time_ms(lambda: triton_store.store_cache(kc, vc, loc, k, v))),
        ("embedding 8192 x 1024", _time_ms(lambda: torch_ops.embedding_gather(ids.long(), w)),
         _time_ms(lambda: triton_store.embedding_gather(ids, w))),
    ]
    with capsys.disabled():
        for name, ref, ours in rows:
            print(f"\n{name}: torch {ref * 1e3:.1f} us, triton {ours * 1e3:.1f} us")
    for name, ref, ours in rows:
        assert ours < 3 * ref + 0.05, f"{name}: triton {ours:.3f} ms vs torch {ref:.3f} ms"


@pytest.mark.gpu
def test_the_pool_and_the_embedding_use_triton_on_cuda():
    from minisgl.kernel import use_triton

    assert use_triton(torch.zeros(1, device="cuda"))
