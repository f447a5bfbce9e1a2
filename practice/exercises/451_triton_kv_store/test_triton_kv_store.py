"""Exercise 451: the KV store kernel, checked bit for bit against the torch reference.

On the CPU the judge runs the kernel in Triton's interpreter (TRITON_INTERPRET=1, set
before triton is imported); on a GPU (MINISGL_DEVICE=cuda) it is compiled.
"""

from __future__ import annotations

import os

import pytest
import torch

from minisgl.kernel import torch_ops
from minisgl.kernel.triton.store import store_cache

DEVICE = torch.device(os.environ.get("MINISGL_DEVICE") or "cpu")


def _case(num_tokens: int, heads: int, dim: int, slots: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num_tokens, heads, dim, generator=g)
    v = torch.randn(num_tokens, heads, dim, generator=g)
    loc = torch.randperm(slots, generator=g)[:num_tokens]
    caches = [torch.full((slots, heads, dim), -7.0) for _ in range(2)]
    return [t.to(DEVICE) for t in (k, v, loc, *caches)]


def _expected(k, v, loc, k_cache, v_cache):
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    torch_ops.store_cache(k_ref, v_ref, loc, k, v)
    return k_ref, v_ref


def _check(k, v, loc, k_cache, v_cache, what: str) -> None:
    k_ref, v_ref = _expected(k, v, loc, k_cache, v_cache)
    store_cache(k_cache, v_cache, loc, k, v)
    assert torch.equal(k_cache, k_ref), f"{what}: the K cache differs from the reference"
    assert torch.equal(v_cache, v_ref), f"{what}: the V cache differs from the reference"


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_the_slot_comes_from_loc(index_dtype):
    k, v, loc, kc, vc = _case(num_tokens=5, heads=2, dim=8, slots=16)
    _check(k, v, loc.to(index_dtype), kc, vc, f"5 tokens at slots {loc.tolist()}")


def test_v_goes_to_the_v_cache():
    k, v, loc, kc, vc = _case(num_tokens=3, heads=1, dim=16, slots=8, seed=1)
    store_cache(kc, vc, loc, k, v)
    for i, slot in enumerate(loc.tolist()):
        assert torch.equal(vc[slot], v[i]), f"token {i}: v_cache[{slot}] should hold v[{i}]"
        assert torch.equal(kc[slot], k[i]), f"token {i}: k_cache[{slot}] should hold k[{i}]"


def test_strided_rows_are_read_at_their_stride(drawn_seed):
    # k and v as views of one fused qkv output [T, (Hq + 2 * Hkv) * D]: rows strided
    t, hq, hkv, d, slots = 4, 4, 2, 8, 12
    g = torch.Generator().manual_seed(drawn_seed)  # new rows and slots in every judged run
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g).to(DEVICE)
    k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
    assert k.stride(0) == (hq + 2 * hkv) * d  # the case is really strided
    loc = torch.randperm(slots, generator=g)[:t].to(DEVICE)
    kc = torch.zeros(slots, hkv, d, device=DEVICE)
    vc = torch.zeros(slots, hkv, d, device=DEVICE)
    _check(k, v, loc, kc, vc, "k and v as strided slices of a qkv output")


def test_a_row_that_is_not_a_power_of_two():
    k, v, loc, kc, vc = _case(num_tokens=4, heads=5, dim=8, slots=10, seed=3)  # ROW 40
    _check(k, v, loc, kc, vc, "rows of 40 elements (BLOCK 64)")
    untouched = sorted(set(range(10)) - set(loc.tolist()))
    assert bool((kc[untouched] == -7.0).all()), f"slots {untouched} must stay untouched"


def test_no_tokens_is_a_no_op():
    k, v, loc, kc, vc = _case(num_tokens=0, heads=2, dim=8, slots=4)
    _check(k, v, loc, kc, vc, "zero tokens")
