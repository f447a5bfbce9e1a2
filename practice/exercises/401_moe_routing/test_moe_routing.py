"""Exercise 401: fused_topk (router top-k, renormalised) and moe_align_block_size.

Everything runs on ``MINISGL_DEVICE`` (the CPU by default); ``transformers``' router is the
reference for the top-k, and the alignment is checked by its invariants.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from minisgl.moe.routing import fused_topk, moe_align_block_size

DEVICE = torch.device(os.environ.get("MINISGL_DEVICE") or "cpu")


def routing(tokens: int, top_k: int, experts: int, seed: int) -> torch.Tensor:
    """``[T, k]`` distinct experts per token, as a router produces them."""
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]
    return torch.stack(rows).to(device=DEVICE, dtype=torch.int32)


# --------------------------------------------------------------------------- fused_topk


def test_topk_picks_the_largest_probabilities():
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.1, 0.3, 0.2]], device=DEVICE))
    w, ids = fused_topk(logits, 2, renormalize=False)
    assert ids.tolist() == [[3, 2], [0, 2]], (
        f"expected experts [[3, 2], [0, 2]] (largest first), got {ids.tolist()}"
    )
    assert torch.allclose(w.cpu(), torch.tensor([[0.4, 0.3], [0.4, 0.3]]), atol=1e-6), (
        f"without renormalize the weights are the softmax probabilities 0.4, 0.3; got {w.tolist()}"
    )


def test_weights_are_renormalised_only_when_asked():
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]], device=DEVICE))
    w, _ = fused_topk(logits, 2, renormalize=True)
    assert torch.allclose(w.cpu(), torch.tensor([[4 / 7, 3 / 7]]), atol=1e-6), (
        f"0.4 and 0.3 renormalised are 4/7 and 3/7; got {w.tolist()}"
    )
    logits = torch.randn(9, 16, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    w, _ = fused_topk(logits, 4, renormalize=True)
    assert torch.allclose(w.sum(-1).cpu(), torch.ones(9), atol=1e-6), (
        f"rows must sum to 1: {w.sum(-1).tolist()}"
    )
    raw, _ = fused_topk(logits, 4, renormalize=False)
    assert (raw.sum(-1) < 1).all(), "without renormalize the kept probabilities sum to less than 1"


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_matches_the_transformers_router(norm, dtype, drawn_seed):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    router = Qwen3MoeTopKRouter(
        Qwen3MoeConfig(hidden_size=32, num_experts=16, num_experts_per_tok=4, norm_topk_prob=norm)
    )
    g = torch.Generator().manual_seed(drawn_seed)  # new weights and inputs in every judged run
    torch.nn.init.normal_(router.weight, generator=g)
    x = torch.randn(21, 32, generator=g)
    logits = F.linear(x, router.weight.detach()).to(dtype)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    want_w, want_ids = torch.topk(probs, 4, dim=-1)
    if norm:
        want_w = want_w / want_w.sum(dim=-1, keepdim=True)
    if dtype == torch.float32:  # the router itself, end to end
        with torch.no_grad():
            _, hf_w, hf_ids = router(x)
        assert torch.equal(hf_ids, want_ids) and torch.equal(hf_w, want_w)
    w, ids = fused_topk(logits.to(DEVICE), 4, renormalize=norm)
    assert torch.equal(ids.cpu().long(), want_ids), (
        f"experts differ: got {ids[:2].tolist()}, want {want_ids[:2].tolist()}"
    )
    assert torch.equal(w.cpu(), want_w), (
        f"weights differ by up to {float((w.cpu() - want_w).abs().max()):.3g}"
    )


def test_weights_are_float32_and_ids_int32():
    w, ids = fused_topk(torch.randn(3, 8, device=DEVICE).to(torch.bfloat16), 2, renormalize=True)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32, (
        f"got weights {w.dtype}, ids {ids.dtype}"
    )
    assert w.shape == ids.shape == (3, 2), (
        f"both must be [T, k] = (3, 2); got {tuple(w.shape)}, {tuple(ids.shape)}"
    )


def test_topk_rejects_bad_arguments():
    with pytest.raises(ValueError):
        fused_topk(torch.zeros(2, 4, device=DEVICE), 5, True)
    with pytest.raises(ValueError):
        fused_topk(torch.zeros(2, 4, device=DEVICE), 0, True)
    with pytest.raises(ValueError):
        fused_topk(torch.zeros(4, device=DEVICE), 1, True)


# --------------------------------------------------------------------------- moe_align_block_size


CASES = [(1, 2, 8, 16), (37, 2, 8, 4), (50, 8, 64, 16), (5, 3, 16, 1), (64, 2, 4, 64)]


@pytest.mark.parametrize("tokens,top_k,experts,block", CASES)
def test_every_slot_appears_exactly_once(tokens, top_k, experts, block):
    sorted_ids, _, total = moe_align_block_size(
        routing(tokens, top_k, experts, tokens), block, experts
    )
    n = tokens * top_k
    real = sorted_ids[sorted_ids < n].cpu()
    assert sorted(real.tolist()) == list(range(n)), f"slots 0..{n - 1} must each appear once"
    assert (sorted_ids[int(total) :] == n).all(), (
        f"entries past num_tokens_post_padded={int(total)} must be {n}"
    )


@pytest.mark.parametrize("tokens,top_k,experts,block", CASES)
def test_each_expert_run_is_padded_to_a_block(tokens, top_k, experts, block):
    ids = routing(tokens, top_k, experts, tokens)
    sorted_ids, expert_ids, total = moe_align_block_size(ids, block, experts)
    counts = torch.bincount(ids.flatten().long().cpu(), minlength=experts)
    want = int(((counts + block - 1) // block * block).sum())
    assert int(total) == want, (
        f"num_tokens_post_padded: got {int(total)}, want {want} (each run rounded up to {block})"
    )
    flat = ids.flatten().cpu()
    s, e = sorted_ids.cpu(), expert_ids.cpu()
    for b in range(want // block):
        rows = s[b * block : (b + 1) * block]
        slots = rows[rows < ids.numel()].long()
        assert slots.numel() > 0, (
            f"block {b} is all padding: runs must be padded to a block, no more"
        )
        assert (flat[slots] == e[b]).all(), (
            f"block {b} (expert {int(e[b])}) holds slots of experts {flat[slots].tolist()}"
        )


@pytest.mark.parametrize("tokens,top_k,experts,block", CASES)
def test_slots_keep_token_order_within_an_expert(tokens, top_k, experts, block):
    sorted_ids, expert_ids, total = moe_align_block_size(
        routing(tokens, top_k, experts, tokens), block, experts
    )
    used = sorted_ids[: int(total)].cpu()
    runs = expert_ids[: int(total) // block].cpu()
    assert torch.equal(runs, runs.sort().values), (
        f"experts must come in increasing order: {runs.tolist()}"
    )
    for ex in runs.unique().tolist():
        rows = used.view(-1, block)[runs == ex].flatten()
        slots = rows[rows < tokens * top_k]
        assert torch.equal(slots, slots.sort().values), (
            f"expert {ex}: slots {slots.tolist()} not increasing"
        )


@pytest.mark.parametrize("tokens,top_k,experts,block", CASES)
def test_blocks_past_the_end_name_no_expert(tokens, top_k, experts, block):
    sorted_ids, expert_ids, total = moe_align_block_size(
        routing(tokens, top_k, experts, tokens), block, experts
    )
    assert expert_ids.numel() == -(-sorted_ids.numel() // block), (
        f"one expert id per block: {expert_ids.numel()} for {sorted_ids.numel()} entries of blocks of {block}"
    )
    tail = expert_ids[int(total) // block :]
    assert (tail == -1).all(), f"blocks past num_tokens_post_padded must be -1, got {tail.tolist()}"


def test_experts_without_tokens_take_no_block():
    ids = torch.tensor([[5, 1], [5, 1], [1, 5]], device=DEVICE, dtype=torch.int32)
    sorted_ids, expert_ids, total = moe_align_block_size(ids, 4, 8)
    assert expert_ids.tolist()[:2] == [1, 5] and int(total) == 8, (
        f"only experts 1 and 5 were chosen: want blocks [1, 5] and 8 entries, got {expert_ids.tolist()}, {int(total)}"
    )
    assert sorted_ids.tolist()[:8] == [1, 3, 4, 6, 0, 2, 5, 6]


def test_output_sizes_depend_only_on_shapes():
    a = moe_align_block_size(routing(10, 2, 8, 1), 4, 8)
    b = moe_align_block_size(torch.zeros(10, 2, device=DEVICE, dtype=torch.int32), 4, 8)
    assert [t.shape for t in a] == [t.shape for t in b], (
        f"a CUDA graph replays fixed shapes: {[tuple(t.shape) for t in a]} vs {[tuple(t.shape) for t in b]}"
    )
    assert sorted(x.device.type for x in a) == [DEVICE.type] * 3, (
        "results stay on the input's device"
    )


def test_align_rejects_bad_arguments():
    with pytest.raises(ValueError):
        moe_align_block_size(torch.zeros(2, 2, dtype=torch.int32, device=DEVICE), 0, 4)
    with pytest.raises(ValueError):
        moe_align_block_size(torch.zeros(4, dtype=torch.int32, device=DEVICE), 4, 4)


def test_the_worked_example():
    ids = torch.tensor(
        [[1, 2, 3], [0, 1, 3], [0, 2, 3], [0, 1, 2]], device=DEVICE, dtype=torch.int32
    )
    sorted_ids, expert_ids, total = moe_align_block_size(ids, 4, 4)
    p = 12
    want = [3, 6, 9, p, 0, 4, 10, p, 1, 7, 11, p, 2, 5, 8, p] + [p] * 8
    assert sorted_ids.tolist() == want, f"sorted_token_ids: got {sorted_ids.tolist()}, want {want}"
    assert expert_ids.tolist() == [0, 1, 2, 3, -1, -1], f"expert_ids: got {expert_ids.tolist()}"
    assert total.tolist() == [16], f"num_tokens_post_padded: got {total.tolist()}, want [16]"
    assert {t.dtype for t in (sorted_ids, expert_ids, total)} == {torch.int32}, (
        "all three are int32"
    )
