"""Drive an ``Engine`` by hand, without a scheduler: for benchmarks and backend tests.

The engine's own chapter played the scheduler's part inline; the GPU chapters need the same
moves over and over (compare two attention backends on one batch, time a decode step at
batch 256), so here they are once:

* ``place`` gives request ``i`` row ``i`` of the page table and consecutive, page-aligned
  pages for every position it will ever use (prompt plus new tokens);
* ``build_batch`` fills a batch the way ``Scheduler._prepare_batch`` does and prepares its
  attention metadata;
* ``forward`` runs it and advances each request.

Nothing here frees pages: each call to ``place`` starts again at page 0, so it suits one
experiment at a time. Not in upstream (its tests build batches the same way inline).
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine
from minisgl.utils import div_ceil


def make_req(
    row: int, ids: Sequence[int] | torch.Tensor, cached_len: int = 0, output_len: int = 1 << 20
) -> Req:
    """A request in page-table row ``row`` whose first ``cached_len`` tokens are already in
    the KV cache (their slots must be in the row)."""
    input_ids = torch.as_tensor(ids, dtype=torch.int32).cpu()
    return Req(
        input_ids,
        table_idx=row,
        cached_len=cached_len,
        output_len=output_len,
        uid=row,
        sampling_params=SamplingParams(max_tokens=max(1, output_len)),
    )  # type: ignore[arg-type]


def place(engine: Engine, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> List[Req]:
    """Requests for ``prompts`` in rows ``0..B-1``, each owning ``ceil((len + max_new) / P)``
    consecutive pages from page 0 on, written into the page table.

    Raises:
        ValueError: when the rows, the page table's columns or the pool's pages run out.
    """
    page = engine.config.page_size
    if len(prompts) > engine.config.max_running_req:
        raise ValueError(f"{len(prompts)} requests but only {engine.config.max_running_req} rows")
    reqs, next_page = [], 0
    for row, ids in enumerate(prompts):
        length = len(ids) + max_new_tokens
        if length > engine.page_table.shape[1]:
            raise ValueError(
                f"request {row} needs {length} positions; the page table has {engine.page_table.shape[1]}"
            )
        pages = div_ceil(length, page)
        if next_page + pages > engine.num_pages:
            raise ValueError(f"the KV pool has {engine.num_pages} pages; these requests need more")
        first = next_page * page
        engine.page_table[row, :length] = torch.arange(first, first + length, dtype=torch.int32)
        next_page += pages
        reqs.append(make_req(row, ids, 0, max_new_tokens))
    return reqs


def build_batch(engine: Engine, reqs: Sequence[Req], phase: str) -> Batch:
    """The batch of ``reqs``' next input tokens (``input_ids[cached_len:device_len]``), with
    positions, ``out_loc`` and attention metadata, as ``Scheduler._prepare_batch`` would
    make it."""
    batch = Batch(list(reqs), phase)  # type: ignore[arg-type]
    engine.graph_runner.pad_batch(batch)  # a decode batch, to a captured graph's size  # +ch18
    device = engine.device
    ids = torch.cat([r.input_ids[r.cached_len : r.device_len] for r in batch.padded_reqs])
    positions = torch.cat(
        [torch.arange(r.cached_len, r.device_len, dtype=torch.int32) for r in batch.padded_reqs]
    )
    rows = torch.cat(
        [torch.full((r.extend_len,), r.table_idx, dtype=torch.int64) for r in batch.padded_reqs]
    )
    batch.input_ids = ids.to(device)
    batch.positions = positions.to(device)
    batch.out_loc = engine.page_table[rows.to(device), positions.to(device).long()]
    engine.attn_backend.prepare_metadata(batch)
    return batch


def forward(
    engine: Engine,
    batch: Batch,
    use_graph: bool = True,  # +ch18
) -> torch.Tensor:
    """Logits ``[B, V]`` of ``batch`` (a copy, float32); every request advances one step."""
    with torch.inference_mode(), engine.ctx.forward_batch(batch):
        # >>> ch18: through a CUDA graph when one fits (use_graph=False: eagerly even then)
        if use_graph and engine.graph_runner.can_use_cuda_graph(batch):
            logits = engine.graph_runner.replay(batch)
        else:
            logits = engine.model.forward()
        # <<< ch18
        # >>> ch17-ch17
        # logits = engine.model.forward()
        # <<< ch17-ch17
        logits = logits[: batch.size].float().clone()
    for req in batch.reqs:
        req.complete_one()
    return logits


def greedy(
    engine: Engine,
    reqs: Sequence[Req],
    steps: int,
    use_graph: bool = True,  # +ch18
    forced: Sequence[Sequence[int]] | None = None,
) -> Tuple[List[List[int]], List[torch.Tensor]]:
    """Prefill ``reqs`` together, then decode them together for ``steps - 1`` more steps,
    taking the argmax. Returns (tokens ``[B][steps]``, logits ``[steps]`` of ``[B, V]``).

    ``forced[i]`` (teacher forcing): feed these tokens instead of the argmax, so two
    backends can be compared on exactly the same inputs even where their argmax differs.
    """
    tokens: List[List[int]] = [[] for _ in reqs]
    all_logits: List[torch.Tensor] = []
    phase = "prefill"
    for step in range(steps):
        batch = build_batch(engine, reqs, phase)
        # >>> ch17-ch17
        # logits = forward(engine, batch)
        # <<< ch17-ch17
        logits = forward(engine, batch, use_graph)  # +ch18
        all_logits.append(logits)
        chosen = logits.argmax(dim=-1).tolist() if forced is None else [f[step] for f in forced]
        for req, out, token in zip(reqs, tokens, chosen):
            out.append(token)
            req.append_host(torch.tensor([token], dtype=torch.int32))
        phase = "decode"
    return tokens, all_logits
