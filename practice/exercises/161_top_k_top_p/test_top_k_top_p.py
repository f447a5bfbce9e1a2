"""Exercise 161: top-k / top-p filtering and the reference sampler."""

from __future__ import annotations

import os

import torch

from minisgl.engine.sample import BatchSamplingArgs, Sampler
from minisgl.kernel.torch_sampling import sample, top_k_top_p_filter

DEVICE = torch.device(os.environ.get("MINISGL_DEVICE") or "cpu")
NEG = float("-inf")


def logits_of(*probs) -> torch.Tensor:
    """``[B, V]`` logits whose softmax is exactly the given rows of probabilities."""
    return torch.tensor(probs, dtype=torch.float32, device=DEVICE).log()


def kept(filtered: torch.Tensor) -> list:
    return [[i for i, x in enumerate(row) if x != NEG] for row in filtered.cpu().tolist()]


def test_off_returns_the_logits():
    x = logits_of([0.5, 0.3, 0.2])
    assert torch.equal(top_k_top_p_filter(x, None, None), x)


def test_top_k_keeps_the_k_largest():
    x = logits_of([0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.4, 0.1])
    got = kept(top_k_top_p_filter(x, torch.tensor([2, 1], device=DEVICE), None))
    assert got == [[1, 3], [2]], f"kept token ids per row: {got}"


def test_top_p_keeps_the_smallest_set_reaching_p():
    x = logits_of([0.5, 0.3, 0.15, 0.05])
    for p, want in [
        (0.45, [0]),
        (0.55, [0, 1]),
        (0.79, [0, 1]),
        (0.81, [0, 1, 2]),
        (1.0, [0, 1, 2, 3]),
    ]:
        got = kept(top_k_top_p_filter(x, None, torch.tensor([p], device=DEVICE)))[0]
        assert got == want, (
            f"top_p={p} on probabilities [0.5, 0.3, 0.15, 0.05]: keep {want}, kept {got}"
        )


def test_the_best_token_always_survives():
    x = logits_of([0.6, 0.4])
    got = kept(top_k_top_p_filter(x, None, torch.tensor([1e-6], device=DEVICE)))
    assert got == [[0]], f"a tiny top_p still keeps the most likely token, kept {got}"


def test_top_p_is_applied_after_top_k():
    # after top-k=2 the probabilities are [4/7, 3/7]: the second one's mass before is 4/7 >= 0.5
    x = logits_of([0.4, 0.3, 0.2, 0.1])
    got = kept(
        top_k_top_p_filter(x, torch.tensor([2], device=DEVICE), torch.tensor([0.5], device=DEVICE))
    )
    assert got == [[0]], (
        f"kept {got}: top-p must use the distribution renormalised after top-k "
        "(4/7 of the mass is above token 1, more than top_p=0.5)"
    )


def test_filter_keeps_the_vocabulary_order():
    x = logits_of([0.05, 0.5, 0.15, 0.3])
    out = top_k_top_p_filter(x, torch.tensor([3], device=DEVICE), None)
    assert kept(out) == [[1, 2, 3]], f"kept {kept(out)}"
    assert torch.equal(out[0, 1:], x[0, 1:]), (
        "surviving logits keep their values and their positions"
    )


def test_all_greedy_batch_takes_the_argmax():
    s = Sampler(DEVICE, vocab_size=4)
    x = logits_of([0.1, 0.2, 0.6, 0.1], [0.7, 0.1, 0.1, 0.1])
    got = s.sample(x, BatchSamplingArgs(temperatures=None)).cpu().tolist()
    assert got == [2, 0], f"argmax of each row is [2, 0], got {got}"


def test_greedy_rows_of_a_mixed_batch_take_the_argmax():
    s = Sampler(DEVICE, vocab_size=4)
    x = logits_of([0.3, 0.2, 0.4, 0.1], [0.25, 0.25, 0.25, 0.25])
    args = BatchSamplingArgs(
        temperatures=torch.tensor([1.0, 1.0], device=DEVICE),
        greedy=torch.tensor([True, False], device=DEVICE),
    )
    for _ in range(20):
        out = s.sample(x, args)
        assert int(out[0]) == 2, f"row 0 is greedy: always token 2, got {out.tolist()}"
        assert out.dtype == torch.int64 and out.shape == (2,)


def test_filtered_tokens_are_never_drawn():
    s = Sampler(DEVICE, vocab_size=5)
    x = logits_of(*[[0.3, 0.25, 0.2, 0.15, 0.1]] * 64)
    args = BatchSamplingArgs(
        temperatures=torch.full((64,), 1.0, device=DEVICE),
        top_k=torch.full((64,), 5, device=DEVICE),
        top_p=torch.full((64,), 0.5, device=DEVICE),
        greedy=torch.zeros(64, dtype=torch.bool, device=DEVICE),
    )
    drawn = set(s.sample(x, args).cpu().tolist())
    assert drawn <= {0, 1}, f"top_p=0.5 keeps tokens {{0, 1}}, drew {sorted(drawn)}"


def test_sampled_frequencies_follow_the_distribution():
    s = Sampler(DEVICE, vocab_size=3, seed=0)
    n = 4000
    x = logits_of(*[[0.7, 0.2, 0.1]] * n)
    args = BatchSamplingArgs(
        temperatures=torch.full((n,), 1.0, device=DEVICE),
        greedy=torch.zeros(n, dtype=torch.bool, device=DEVICE),
    )
    freq = torch.bincount(s.sample(x, args).cpu(), minlength=3).float() / n
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03), (
        f"frequencies {freq.tolist()}"
    )


def test_temperature_sharpens():
    s = Sampler(DEVICE, vocab_size=2, seed=0)
    n = 4000
    x = logits_of(*[[0.6, 0.4]] * n)
    args = BatchSamplingArgs(
        temperatures=torch.full((n,), 0.25, device=DEVICE),
        greedy=torch.zeros(n, dtype=torch.bool, device=DEVICE),
    )
    share = float((s.sample(x, args) == 0).float().mean())
    want = 0.6**4 / (0.6**4 + 0.4**4)  # softmax(log p / T) with T = 1/4
    assert abs(share - want) < 0.03, (
        f"with temperature 0.25 token 0 should come {want:.3f} of the time, came {share:.3f}"
    )


def nucleus(probs: list, k: int, p: float) -> list:
    """The token ids kept by top-k, then top-p on the renormalised top-k, in plain Python."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])[:k]
    total = sum(probs[i] for i in order)
    kept, mass = [], 0.0
    for i in order:
        if kept and mass >= p:
            break
        kept.append(i)
        mass += probs[i] / total
    return sorted(kept)


def test_drawn_rows_keep_their_nucleus_and_draw_from_it(drawn_seed):
    """Logits, top-k and top-p drawn at random (each judged run draws new ones): the filter
    keeps each row's nucleus, and every sampled token comes from it."""
    gen = torch.Generator().manual_seed(drawn_seed)
    rows, vocab = 8, int(torch.randint(5, 50, (), generator=gen))
    x = (3 * torch.randn(rows, vocab, generator=gen)).to(DEVICE)
    top_k = torch.randint(1, vocab + 1, (rows,), generator=gen).to(DEVICE)
    top_p = (0.05 + 0.95 * torch.rand(rows, generator=gen)).to(DEVICE)
    got = kept(top_k_top_p_filter(x, top_k, top_p))
    probs = torch.softmax(x.double(), -1).cpu().tolist()
    for row in range(rows):
        k, p = int(top_k[row]), float(top_p[row])
        want = nucleus(probs[row], k, p)
        assert got[row] == want, (
            f"row {row} (top_k={k}, top_p={p:.3f}): kept {got[row]}, want {want}"
        )
    temperatures = (0.5 + torch.rand(rows, generator=gen)).to(DEVICE)
    draw = torch.Generator(device=DEVICE).manual_seed(drawn_seed)
    filtered = kept(top_k_top_p_filter(x / temperatures.unsqueeze(1), top_k, top_p))
    for _ in range(4):
        tokens = sample(x, temperatures, top_k, top_p, draw).cpu().tolist()
        for row, token in enumerate(tokens):
            assert token in filtered[row], f"row {row} drew {token}, outside {filtered[row]}"
