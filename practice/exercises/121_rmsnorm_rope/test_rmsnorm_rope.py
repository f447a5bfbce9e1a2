"""Exercise 121: rms_norm / fused_add_rms_norm / apply_rotary against their formulas."""

from __future__ import annotations

import os

import pytest
import torch

from minisgl.kernel.torch_ops import apply_rotary, fused_add_rms_norm, rms_norm

DEVICE = torch.device(os.environ.get("MINISGL_DEVICE") or "cpu")


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str, atol: float = 0.0) -> None:
    """Shapes first, then the largest difference and the first index that differs."""
    assert got.shape == want.shape, (
        f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    )
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    diff = (got.float() - want.float()).abs()
    bad = diff > atol
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: max |diff| {float(diff.max()):.3g} (allowed {atol}); first at {idx}: "
            f"got {float(got[idx]):.6g}, expected {float(want[idx]):.6g}"
        )


def cos_sin_cache(max_position: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(DEVICE)


def reference_rotary(positions, x, cache):
    """Each pair (i, i + D/2) is a complex number multiplied by e^{i * angle}."""
    half = x.shape[-1] // 2
    cos, sin = cache[positions.long()].chunk(2, dim=-1)
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    rot = torch.complex(cos.double(), sin.double()).unsqueeze(1)
    out = z * rot
    return torch.cat((out.real, out.imag), dim=-1).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_the_formula_bit_for_bit(dtype, drawn_seed):
    g = torch.Generator().manual_seed(drawn_seed)  # new inputs in every judged run
    x = torch.randn(5, 64, generator=g).to(DEVICE, dtype)
    w = torch.randn(64, generator=g).to(DEVICE, dtype)
    x32 = x.float()
    want = w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    assert_same(rms_norm(x, w, 1e-6), want, f"rms_norm in {dtype}")


def test_rms_norm_of_zero_is_zero():
    out = rms_norm(torch.zeros(2, 8, device=DEVICE), torch.ones(8, device=DEVICE), 1e-6)
    assert torch.isfinite(out).all() and not out.any(), f"eps keeps the zero vector finite: {out}"


def test_rms_norm_works_on_any_leading_shape():
    x = torch.randn(2, 3, 16, device=DEVICE)
    out = rms_norm(x, torch.ones(16, device=DEVICE), 1e-5)
    assert out.shape == x.shape
    assert_same(
        out.pow(2).mean(-1),
        torch.ones(2, 3, device=DEVICE),
        "mean square after the norm",
        atol=1e-3,
    )


def test_fused_add_returns_norm_and_new_residual():
    x, r, w = (torch.randn(4, 32, device=DEVICE) for _ in range(3))
    normed, residual = fused_add_rms_norm(x, r, w[0], 1e-6)
    assert_same(residual, x + r, "the new residual")
    assert_same(normed, rms_norm(x + r, w[0], 1e-6), "the normed output")


def test_rotary_matches_a_complex_rotation():
    cache = cos_sin_cache(128, 32)
    positions = torch.tensor([0, 5, 77, 3, 3, 127], device=DEVICE)  # unsorted and repeated
    q = torch.randn(6, 4, 32, device=DEVICE)
    k = torch.randn(6, 2, 32, device=DEVICE)  # GQA: fewer KV heads
    q_out, k_out = apply_rotary(positions, q, k, cache)
    assert_same(q_out, reference_rotary(positions, q, cache), "rotated q", atol=1e-5)
    assert_same(k_out, reference_rotary(positions, k, cache), "rotated k", atol=1e-5)


def test_position_zero_is_the_identity():
    q = torch.randn(3, 2, 16, device=DEVICE)
    q_out, _ = apply_rotary(
        torch.zeros(3, dtype=torch.long, device=DEVICE), q, q.clone(), cos_sin_cache(8, 16)
    )
    assert_same(q_out, q, "q at position 0", atol=1e-6)


def test_rotation_preserves_the_norm():
    q = torch.randn(10, 3, 64, device=DEVICE)
    q_out, _ = apply_rotary(
        torch.arange(10, device=DEVICE) * 13, q, q.clone(), cos_sin_cache(200, 64)
    )
    assert_same(q_out.norm(dim=-1), q.norm(dim=-1), "norm of each head", atol=1e-4)


def test_scores_depend_only_on_the_distance():
    cache = cos_sin_cache(64, 16)
    q, k = torch.randn(1, 1, 16, device=DEVICE), torch.randn(1, 1, 16, device=DEVICE)
    scores = []
    for m, n in [(3, 1), (10, 8), (40, 38)]:
        qm, _ = apply_rotary(torch.tensor([m], device=DEVICE), q, q.clone(), cache)
        _, kn = apply_rotary(torch.tensor([n], device=DEVICE), k.clone(), k, cache)
        scores.append(float((qm * kn).sum()))
    assert max(scores) - min(scores) < 1e-4, (
        f"q·k at distance 2 should not depend on the position: {scores}"
    )


def test_inputs_are_not_modified():
    q, k = torch.randn(4, 2, 8, device=DEVICE), torch.randn(4, 1, 8, device=DEVICE)
    q0, k0 = q.clone(), k.clone()
    apply_rotary(torch.arange(4, device=DEVICE) + 1, q, k, cos_sin_cache(8, 8))
    assert torch.equal(q, q0) and torch.equal(k, k0), "apply_rotary must not write into q or k"


def test_output_keeps_the_input_dtype():
    q = torch.randn(2, 2, 8, device=DEVICE, dtype=torch.bfloat16)
    q_out, k_out = apply_rotary(torch.arange(2, device=DEVICE), q, q.clone(), cos_sin_cache(4, 8))
    assert q_out.dtype == k_out.dtype == torch.bfloat16
