"""Time one layer's decode attention: FlashInfer's two decode kernels and the batch kernel (chapter 20).

    python -m minisgl.benchmark.decode_attention                       # 8 to 256 requests
    python -m minisgl.benchmark.decode_attention --cases 64x1024 256x559r

A case ``BxC`` is ``B`` requests of ``C`` tokens each; ``BxCr`` gives them ragged lengths,
uniform from 64 to ``2C - 64`` (mean ``C``), like a step of the offline run. Qwen3-0.6B's
attention shapes (16 query heads, 8 KV heads of 128, bf16), pages of ``--page-size``
(default 256) in shuffled order. Each kernel is captured into a CUDA graph, as the engine
runs it (FlashInfer's wrappers with ``use_cuda_graph=True``, as chapter 18 builds them), over
``--layers`` (28) separate pools so that no call finds its KV in the L2 cache. It prints
microseconds per layer and the KV bandwidth (bytes of K and V read over the time) of
FlashInfer on CUDA cores, on tensor cores and of the batch kernel, its programs started in
the batch's order and longest context first (as the engine runs it when the batch has more
programs than the GPU holds at once), with the batch kernel's largest difference from
FlashInfer's output. Needs a CUDA GPU, ``flashinfer`` and ``triton``.
"""

from __future__ import annotations

import argparse
from typing import List, Tuple

import torch

from .common import format_table, graph_time_us, measure_copy_bandwidth

HEADS_Q, HEADS_KV, HEAD_DIM = 16, 8, 128  # Qwen3-0.6B
DEFAULT_CASES = ["8x1024", "32x1024", "64x1024", "128x1024", "256x1024", "128x656r", "256x559r"]


def parse_case(text: str) -> Tuple[int, int, bool]:
    """``"64x1024"`` -> (64, 1024, False); ``"256x559r"`` -> (256, 559, True).

    Raises:
        ValueError: for anything else, or a ragged mean below 65 tokens.
    """
    ragged = text.endswith("r")
    try:
        bs, ctx = (int(x) for x in text.rstrip("r").split("x"))
    except ValueError:
        raise ValueError(f"a case is BxC or BxCr, got {text!r}") from None
    if bs < 1 or ctx < (65 if ragged else 1):
        raise ValueError(f"need B >= 1 and C >= 1 (65 when ragged), got {text!r}")
    return bs, ctx, ragged


def context_lengths(bs: int, ctx: int, ragged: bool, seed: int = 0) -> torch.Tensor:
    """``[B]`` int64: all ``ctx``, or uniform in ``[64, 2 ctx - 64]``."""
    if not ragged:
        return torch.full((bs,), ctx)
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(64, 2 * ctx - 63, (bs,), generator=gen)


def paged_index(lens: torch.Tensor, page: int, num_pages: int) -> List[torch.Tensor]:
    """FlashInfer's paged index (indptr, page ids, last page lengths) of requests of ``lens``
    tokens on shuffled pages of a pool of ``num_pages``, on the GPU."""
    pages = (lens + page - 1) // page
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = pages.cumsum(0)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randperm(num_pages, generator=gen)[: int(pages.sum())].int()
    last = (lens - (pages - 1) * page).int()
    return [t.cuda() for t in (indptr, ids, last)]


def time_case(bs: int, ctx: int, ragged: bool, page: int, layers: int, replays: int) -> list:
    import flashinfer

    from minisgl.attention.split_kv import longest_first
    from minisgl.kernel.triton.decode_batch import decode_attention_batch

    lens = context_lengths(bs, ctx, ragged)
    num_pages = int(((lens + page - 1) // page).sum())
    shape = (num_pages, page, HEADS_KV, HEAD_DIM)
    pools = [
        (torch.randn(shape, device="cuda").bfloat16(), torch.randn(shape, device="cuda").bfloat16())
        for _ in range(layers)
    ]
    index = paged_index(lens, page, num_pages)
    q = torch.randn(bs, HEADS_Q, HEAD_DIM, device="cuda").bfloat16()
    workspace = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    kv_bytes = int(lens.sum()) * HEADS_KV * HEAD_DIM * 2 * 2
    row = [f"{bs}x{ctx}{'r' if ragged else ''}", f"{kv_bytes / 1e6:.0f}"]
    want = None
    for tensor_cores in (False, True):
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, kv_layout="NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
            paged_kv_indptr_buffer=index[0].clone(), paged_kv_indices_buffer=index[1].clone(),
            paged_kv_last_page_len_buffer=index[2].clone(), backend="fa2",
        )  # fmt: skip
        wrapper.plan(*index, HEADS_Q, HEADS_KV, HEAD_DIM, page, pos_encoding_mode="NONE",
                     q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)  # fmt: skip
        want = wrapper.run(q, pools[0]) if want is None else want
        calls = [lambda kv=kv, w=wrapper: w.run(q, kv) for kv in pools]
        us = graph_time_us(calls, replays)
        row += [f"{us:.1f}", f"{kv_bytes / us / 1e6:.2f}"]
    slots = [(k.view(-1, HEADS_KV, HEAD_DIM), v.view(-1, HEADS_KV, HEAD_DIM)) for k, v in pools]
    scale = HEAD_DIM**-0.5
    longest = torch.tensor(longest_first(lens.tolist(), HEADS_KV, 0), dtype=torch.int32).cuda()
    got = decode_attention_batch(q, *slots[0], *index, page, scale, longest)
    for order in (None, longest):
        calls = [
            lambda kv=kv, o=order: decode_attention_batch(q, *kv, *index, page, scale, o)
            for kv in slots
        ]
        us = graph_time_us(calls, replays)
        row += [f"{us:.1f}", f"{kv_bytes / us / 1e6:.2f}"]
    err = float((got.float() - want.float()).abs().max())
    return row + [f"{err:.1e}"]


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cases", nargs="+", default=DEFAULT_CASES, type=str)
    p.add_argument("--page-size", type=int, default=256)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--replays", type=int, default=20)
    args = p.parse_args(argv)
    cases = [parse_case(c) for c in args.cases]
    if not torch.cuda.is_available():
        raise SystemExit("decode_attention needs a CUDA GPU")
    bandwidth = measure_copy_bandwidth(torch.device("cuda"))
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s; pages of {args.page_size}; one layer")
    header = ["case", "KV MB", "FI cuda-core us", "TB/s", "FI tensor-core us", "TB/s",
              "batch kernel us", "TB/s", "longest first us", "TB/s", "max |diff|"]  # fmt: skip
    rows = []
    for case in cases:  # each row as it is timed, so that a run cut short keeps what it timed
        rows.append(time_case(*case, args.page_size, args.layers, args.replays))
        print(" | ".join(rows[-1]), flush=True)
    print(format_table(header, rows))


if __name__ == "__main__":
    main()
