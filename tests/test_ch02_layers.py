"""Chapter 2: the layers, checked against Hugging Face's own modules."""

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from minisgl.layers import (
    BaseOP,
    LinearColParallelMerged,
    LinearQKVMerged,
    OPList,
    RMSNorm,
    RMSNormFused,
    RotaryEmbedding,
    silu_and_mul,
)
from minisgl.utils import Registry, div_ceil, div_even

torch.manual_seed(0)


def test_rms_norm_equals_hf_bit_for_bit():
    x, w = torch.randn(7, 64), torch.randn(64)
    ours = RMSNorm(64, eps=1e-5)
    ours.weight = w
    hf = LlamaRMSNorm(64, eps=1e-5)
    hf.weight.data.copy_(w)
    assert torch.equal(ours.forward(x), hf(x))


def test_fused_norm_adds_the_residual_first():
    x, r, w = torch.randn(3, 16), torch.randn(3, 16), torch.randn(16)
    norm = RMSNormFused(16, eps=1e-6)
    norm.weight = w
    out, new_residual = norm.forward(x, r)
    assert torch.equal(new_residual, x + r)
    assert torch.equal(out, RMSNorm.forward(norm, x + r))
    out0, residual0 = norm.forward(x, None)  # the first layer starts the residual stream
    assert residual0 is x


ROPE_CASES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
}


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_rotary_matches_hf(case):
    params = ROPE_CASES[case]
    head_dim, max_pos = 32, 512
    config = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        max_position_embeddings=max_pos,
        rope_parameters=params,
    )
    positions = torch.tensor([0, 1, 2, 300, 7, 511])  # a packed batch: any order
    q, k = torch.randn(6, 4, head_dim), torch.randn(6, 2, head_dim)
    scaling = (
        {k_: v for k_, v in params.items() if k_ != "rope_theta"} if case != "default" else None
    )
    rope = RotaryEmbedding(head_dim, head_dim, max_pos, params["rope_theta"], scaling)
    ours_q, ours_k = rope.forward(positions, q, k)
    cos, sin = LlamaRotaryEmbedding(config)(q, positions.unsqueeze(0))
    # HF wants [batch, heads, seq, dim]
    ref_q, ref_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    torch.testing.assert_close(ours_q, ref_q[0].transpose(0, 1), rtol=0, atol=1e-6)
    torch.testing.assert_close(ours_k, ref_k[0].transpose(0, 1), rtol=0, atol=1e-6)


def test_rope_scores_depend_only_on_distance():
    rope = RotaryEmbedding(16, 16, 128, 10000.0)
    q, k = torch.randn(1, 1, 16), torch.randn(1, 1, 16)

    def score(m, n):
        qm, _ = rope.forward(torch.tensor([m]), q, k)
        _, kn = rope.forward(torch.tensor([n]), q, k)
        return float((qm * kn).sum())

    assert score(10, 7) == pytest.approx(score(50, 47), abs=1e-4)


def test_merged_qkv_equals_three_projections():
    hidden, head_dim, hq, hkv = 32, 8, 4, 2
    wq, wk, wv = (
        torch.randn(hq * head_dim, hidden),
        torch.randn(hkv * head_dim, hidden),
        torch.randn(hkv * head_dim, hidden),
    )
    layer = LinearQKVMerged(hidden, head_dim, hq, hkv, has_bias=False)
    assert layer.weight.shape == (hq * head_dim + 2 * hkv * head_dim, hidden)
    layer.weight = torch.cat([wq, wk, wv])
    x = torch.randn(5, hidden)
    q, k, v = layer.forward(x).split([hq * head_dim, hkv * head_dim, hkv * head_dim], dim=-1)
    torch.testing.assert_close(q, F.linear(x, wq))
    torch.testing.assert_close(k, F.linear(x, wk))
    torch.testing.assert_close(v, F.linear(x, wv))


def test_gate_up_merge_and_swiglu():
    gate_up = LinearColParallelMerged(16, [24, 24], has_bias=False)
    assert gate_up.weight.shape == (48, 16)
    x = torch.randn(3, 48)
    torch.testing.assert_close(silu_and_mul(x), F.silu(x[:, :24]) * x[:, 24:])


class Block(BaseOP):
    def __init__(self):
        self.proj = LinearColParallelMerged(4, [2, 2], has_bias=True)
        self.norm = RMSNorm(4, 1e-6)
        self._cache = torch.zeros(3)  # private: not a weight


def test_state_dict_names_follow_attribute_paths():
    model = OPList([Block(), Block()])
    assert sorted(model.state_dict()) == [
        "0.norm.weight",
        "0.proj.bias",
        "0.proj.weight",
        "1.norm.weight",
        "1.proj.bias",
        "1.proj.weight",
    ]


def test_load_state_dict_reports_missing_mismatched_and_extra_weights():
    block = Block()
    good = {k: torch.ones_like(v) for k, v in block.state_dict().items()}
    block.load_state_dict(dict(good))
    assert torch.equal(block.norm.weight, torch.ones(4))
    with pytest.raises(KeyError, match="norm.weight"):
        Block().load_state_dict({k: v for k, v in good.items() if k != "norm.weight"})
    with pytest.raises(ValueError, match="proj.bias"):
        Block().load_state_dict({**good, "proj.bias": torch.ones(3)})
    with pytest.raises(ValueError, match="unexpected"):
        Block().load_state_dict({**good, "extra.weight": torch.ones(1)})


def test_integer_helpers_and_registry():
    assert div_ceil(10, 4) == 3 and div_even(12, 4) == 3
    assert div_even(2, 4, allow_replicate=True) == 1
    with pytest.raises(ValueError):
        div_even(3, 2)
    reg = Registry[int]("thing")
    reg.register("a")(1)
    assert reg["a"] == 1
    with pytest.raises(ValueError, match="unknown thing 'b'; supported: a"):
        reg["b"]


def test_the_table_runs_the_first_library_that_runs_there_and_takes_the_call(monkeypatch):
    """A library registered before torch, running everywhere, taking one-row calls only: it
    runs those, torch the rest; an op it has no kernel for stays on torch."""
    from minisgl import kernel

    monkeypatch.setitem(kernel.LIBRARIES, "fast", kernel.Library("fast", 0, lambda where: True))
    fast = kernel.Impl("fast", lambda x, w, eps: x * 0, lambda x, *_: x.shape[0] == 1)
    monkeypatch.setitem(kernel.OPS, "rms_norm", [fast, *kernel.OPS["rms_norm"]])
    w = torch.ones(8)
    assert kernel.library_for("rms_norm", torch.randn(1, 8), w, 1e-6) == "fast"
    assert kernel.library_for("rms_norm", torch.randn(2, 8), w, 1e-6) == "torch"
    assert bool((kernel.rms_norm(torch.randn(1, 8), w, 1e-6) == 0).all())
    assert kernel.has_kernel("rms_norm", "fast", None) and not kernel.has_kernel(
        "linear", "fast", None
    )
    with kernel.counting() as calls:
        kernel.rms_norm(torch.randn(2, 8), w, 1e-6)
        kernel.linear(torch.randn(2, 8), torch.randn(3, 8))
    assert calls == {"rms_norm": 1, "linear": 1}
