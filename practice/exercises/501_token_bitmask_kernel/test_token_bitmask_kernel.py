"""Exercise 501: the grammar's bitmask kernel, checked bit for bit against the torch reference.

On the CPU the judge runs the kernel in Triton's interpreter (TRITON_INTERPRET=1, set before
triton is imported); on a GPU (MINISGL_DEVICE=cuda) it is compiled.
"""

from __future__ import annotations

import os

import pytest
import torch

from minisgl.kernel.bitmask import apply_token_bitmask_reference
from minisgl.kernel.triton.bitmask import apply_token_bitmask_triton

DEVICE = torch.device(os.environ.get("MINISGL_DEVICE") or "cpu")


def random_mask(rows: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    words = (vocab + 31) // 32
    return torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, generator=g)


def check(logits: torch.Tensor, bitmask: torch.Tensor, what: str) -> None:
    expected = logits.clone()
    apply_token_bitmask_reference(expected, bitmask)
    apply_token_bitmask_triton(logits, bitmask)
    wrong = logits != expected  # -inf equals -inf
    if bool(wrong.any()):
        row, token = (int(i) for i in wrong.nonzero()[0])
        word = int(bitmask[row, token // 32])
        raise AssertionError(
            f"{what}: row {row}, token {token} (bit {token % 32} of word {token // 32} = "
            f"{word & 0xFFFFFFFF:#010x}, allowed: {(word >> (token % 32)) & 1}): expected "
            f"{float(expected[row, token])}, got {float(logits[row, token])}; "
            f"{int(wrong.sum())} logits differ"
        )


def test_a_token_is_allowed_where_its_bit_is_one():
    V = 70  # three words, the last one partly past the vocabulary
    allowed = [0, 5, 31, 32, 33, 62, 64, 69]  # the lowest and highest bits of each word
    bitmask = torch.zeros(1, 3, dtype=torch.int32)
    for t in allowed:
        bit = torch.tensor(1 << (t % 32), dtype=torch.int64).to(torch.int32)  # bit 31 wraps
        bitmask[0, t // 32] |= bit
    logits = torch.arange(V, dtype=torch.float32).view(1, V)
    check(logits.to(DEVICE), bitmask.to(DEVICE), f"tokens {allowed} allowed")


def test_each_row_reads_its_own_mask_words(drawn_seed):
    g = torch.Generator().manual_seed(drawn_seed)
    B, V = 4, 5000  # rows of 157 words, and two of the kernel's blocks, the second partial
    logits = torch.randn(B, V, generator=g).to(DEVICE)
    check(logits, random_mask(B, V, g).to(DEVICE), "4 rows of 5,000 tokens")


def test_logits_that_are_a_view_of_a_wider_buffer(drawn_seed):
    g = torch.Generator().manual_seed(drawn_seed)
    B, V, WIDE = 3, 77, 96  # a padded vocabulary: the columns past V belong to nobody
    buffer = torch.randn(B, WIDE, generator=g).to(DEVICE)
    before = buffer.clone()
    logits = buffer[:, :V]
    assert logits.stride(0) == WIDE  # the case is really strided
    check(logits, random_mask(B, V, g).to(DEVICE), "logits [3, 77] in a [3, 96] buffer")
    assert torch.equal(buffer[:, V:], before[:, V:]), "columns past the vocabulary were written"


HALVES = [torch.float16] + ([torch.bfloat16] if DEVICE.type == "cuda" else [])  # interpreters vary


@pytest.mark.parametrize("dtype", [torch.float32, *HALVES])
def test_every_bit_of_a_random_mask_counts(dtype, drawn_seed):
    g = torch.Generator().manual_seed(drawn_seed)  # new masks in every judged run
    B, V = 3, 77  # the last word's high bits lie past the vocabulary
    logits = torch.randn(B, V, generator=g).to(DEVICE, dtype)
    check(logits, random_mask(B, V, g).to(DEVICE), f"a random mask, {dtype}")


def test_a_row_of_all_ones_is_untouched():
    logits = torch.randn(2, 100, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    before = logits.clone()
    bitmask = torch.full((2, 4), -1, dtype=torch.int32, device=DEVICE)
    apply_token_bitmask_triton(logits, bitmask)
    assert torch.equal(logits, before), "a mask of all ones must leave every logit as it was"
