"""Chapter 20: temperature sampling in one pass, the Gumbel-max kernel (``triton/sample.py``).

A sampler cannot be compared token for token with another, so the tests check what a
sampler promises: the frequencies of many draws from one distribution (within about four
standard deviations of a binomial), a near-certain token found wherever it sits in a row,
the same tokens for the same generator seed, and the calls the kernel declines. On the
CPU the kernel runs under Triton's interpreter, in a subprocess (the variable is read at
import), with 16-logit blocks so that a row of 100 logits spans several parts or several loop
iterations; on a GPU at Qwen3's vocabulary of 151,936 tokens.
"""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch

from minisgl import kernel
from tests.helpers.interpreter import interpret

HAS_TRITON = importlib.util.find_spec("triton") is not None
PROBS = [0.5, 0.25, 0.125, 0.0625, 0.0625]


def check_frequencies(sample, device: str, dtype: torch.dtype, rows: int, vocab: int) -> None:
    """Draws from ``PROBS`` (the rest of a row at -1e4) at temperatures 1, 2 and 0.05, and
    the generator's seed decides them, for ``sample(logits, temperatures, None, None, gen)``."""
    p = torch.tensor(PROBS, device=device)
    logits = torch.full((rows, vocab), -1e4, device=device)
    logits[:, : len(PROBS)] = p.log()
    logits = logits.to(dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    ones = torch.ones(rows, device=device)
    tolerance = 4 * (0.25 / rows) ** 0.5  # four standard deviations at p = 0.5
    warm = p.sqrt() / p.sqrt().sum()  # temperature 2: softmax(log p / 2)
    for temperature, want in ((1.0, p), (2.0, warm)):
        tokens = sample(logits, temperature * ones, None, None, gen)
        freq = torch.bincount(tokens, minlength=vocab)[: len(PROBS)].float() / rows
        assert torch.allclose(freq, want, atol=tolerance), (temperature, freq.tolist())
    assert bool((sample(logits, 0.05 * ones, None, None, gen) == 0).all())
    seeded = [
        sample(logits, ones, None, None, torch.Generator(device=device).manual_seed(s))
        for s in (5, 5, 6)
    ]
    assert torch.equal(seeded[0], seeded[1]) and not torch.equal(seeded[0], seeded[2])


def check_peaks(sample, device: str, dtype: torch.dtype, rows: int, vocab: int) -> None:
    """One near-certain token per row, anywhere in it (row 0's in the last, masked block):
    the best scores of a row's parts and loop iterations are compared right, and each row
    reads its own logits."""
    peaks = (torch.arange(rows, device=device) * 7919 - 1) % vocab  # row 0: the last logit
    spiky = torch.full((rows, vocab), -30.0, device=device)
    spiky[torch.arange(rows, device=device), peaks] = 30.0
    gen = torch.Generator(device=device).manual_seed(0)
    got = sample(spiky.to(dtype), torch.ones(rows, device=device), None, None, gen)
    assert torch.equal(got, peaks), (got.tolist(), peaks.tolist())


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install triton)")
@pytest.mark.slow
def test_gumbel_sampling_follows_the_distribution_in_the_interpreter():
    script = textwrap.dedent(
        """
        import torch
        from minisgl.kernel.triton import sample
        from test_ch20_sample import check_frequencies, check_peaks
        sample.BLOCK = 16  # a row of 100 logits in 7 blocks
        check_frequencies(sample.gumbel_sample, "cpu", torch.bfloat16, 512, 5)
        for dtype in (torch.bfloat16, torch.float16):
            check_peaks(sample.gumbel_sample, "cpu", dtype, 3, 100)  # 7 parts of one block
        sample.TARGET_PROGRAMS = 1
        check_peaks(sample.gumbel_sample, "cpu", torch.bfloat16, 2, 100)  # 1 part, 7 blocks
        print("interpreter ok")
        """
    )
    res = interpret(script, timeout=300)
    assert res.returncode == 0 and "interpreter ok" in res.stdout, res.stderr[-3000:]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install triton)")
def test_the_kernel_declines_filtered_draws():
    from minisgl.kernel.triton.sample import gumbel_sample

    logits = torch.zeros(2, 10, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="top-k or top-p"):
        gumbel_sample(logits, torch.ones(2), torch.tensor([3, 3]), None, gen)


@pytest.mark.gpu
def test_gumbel_sampling_follows_the_distribution_at_qwen3s_vocabulary():
    from minisgl.kernel.triton.sample import gumbel_sample

    check_frequencies(gumbel_sample, "cuda", torch.bfloat16, 8192, 151936)
    check_peaks(gumbel_sample, "cuda", torch.bfloat16, 256, 151936)  # 4 parts of 19 blocks
    check_peaks(gumbel_sample, "cuda", torch.bfloat16, 3, 151936)  # 75 parts of one block


@pytest.mark.gpu
def test_the_sampler_takes_the_kernel_unless_a_filter_or_the_switch_says_no():
    from minisgl.kernel import speedups

    logits = torch.zeros(4, 151936, device="cuda", dtype=torch.bfloat16)
    temps = torch.ones(4, device="cuda")
    top_k = torch.full((4,), 20, device="cuda")
    assert kernel.library_for("sample", logits, temps, None, None, None) == "triton"
    assert kernel.library_for("sample", logits, temps, top_k, None, None) == "flashinfer"
    assert kernel.library_for("sample", logits.float(), temps, None, None, None) == "torch"
    with speedups.using(sample_kernel=False):
        assert kernel.library_for("sample", logits, temps, None, None, None) == "flashinfer"
