"""Which slice of each weight a tensor-parallel rank owns.

Tensor parallelism splits every big matmul over ``size`` ranks, and each rank keeps only
its slice of the checkpoint's weights:

* **column-parallel** (``q/k/v_proj``, ``gate/up_proj``): the output dim (dim 0 of a
  ``[out, in]`` weight) is cut into ``size`` equal blocks; rank ``r`` keeps block ``r``.
* **KV heads replicated**: with fewer KV heads than ranks, rank ``r`` keeps the whole of
  KV head ``r * H_kv // size``, so ``size / H_kv`` neighbouring ranks share one head, as
  the grouped query heads they hold need it.
* **row-parallel** (``o_proj``, ``down_proj``): the input dim (dim 1) is cut; the partial
  products are summed by an all-reduce in ``LinearRowParallel``.
* **vocab-parallel** (``embed_tokens``, ``lm_head``): rows of the ``[V, hidden]`` table
  in blocks of ``ceil(V / size)``; the last block is padded with zero rows, so that every
  rank holds the same number of rows and the LM head's all-gather gets equal pieces.

``check_tp_size`` refuses a rank count the model's heads cannot be split over. Upstream
keeps these cuts inline, in ``minisgl.models.weight._shard_tensor`` and
``minisgl.layers.embedding.VocabParallelEmbedding.__init__``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class VocabRange(NamedTuple):
    """Rank's rows ``[start, end)`` of the vocabulary, and the padded rows it allocates."""

    start: int
    end: int
    num_embeddings_tp: int  # ceil(V / size): the same on every rank


def check_tp_size(num_qo_heads: int, num_kv_heads: int, intermediate_size: int, size: int) -> None:
    """Refuse a tensor-parallel size the model cannot be split over.

    Query heads and the MLP's intermediate dim must divide evenly; KV heads must divide
    evenly too, or (fewer KV heads than ranks) ``size`` must be a multiple of them.

    Raises:
        ValueError: naming the head counts and the sizes that would work.
    """
    if size < 1:
        raise ValueError(f"the tensor-parallel size must be >= 1, got {size}")
    kv_ok = num_kv_heads % size == 0 if num_kv_heads >= size else size % num_kv_heads == 0
    if num_qo_heads % size == 0 and kv_ok and intermediate_size % size == 0:
        return
    good = [
        n
        for n in range(1, num_qo_heads + 1)
        if num_qo_heads % n == 0
        and intermediate_size % n == 0
        and (num_kv_heads % n == 0 if num_kv_heads >= n else n % num_kv_heads == 0)
    ]
    raise ValueError(
        f"cannot split the model over {size} tensor-parallel ranks: it has {num_qo_heads} query heads, "
        f"{num_kv_heads} KV heads and an MLP of {intermediate_size} columns; each rank needs an equal "
        f"share of the query heads, of the KV heads (or one KV head shared by a whole number of ranks) "
        f"and of the MLP columns. Sizes that work: {', '.join(map(str, good))}"
    )


def shard_column(weight: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rank's block of the output dim: ``[out, ...]`` -> ``[out / size, ...]`` (a copy).

    Raises:
        ValueError: when ``out`` is not divisible by ``size``.
    """
    raise NotImplementedError("Exercise 461: implement shard_column")


def shard_row(weight: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rank's block of the input dim: ``[out, in]`` -> ``[out, in / size]`` (a copy).

    Raises:
        ValueError: when ``in`` is not divisible by ``size``.
    """
    raise NotImplementedError("Exercise 461: implement shard_row")


def shard_kv_heads(weight: torch.Tensor, rank: int, size: int, num_kv_heads: int) -> torch.Tensor:
    """Rank's KV heads of a ``k_proj``/``v_proj`` weight (or bias) ``[H_kv * D, ...]``.

    With ``H_kv >= size``: heads in ``size`` equal blocks, ``[H_kv / size * D, ...]``.
    With fewer heads than ranks: the one head ``rank * H_kv // size``, ``[D, ...]``.
    """
    raise NotImplementedError("Exercise 461: implement shard_kv_heads")


def vocab_range(num_embeddings: int, rank: int, size: int) -> VocabRange:
    """Rank's rows of a vocabulary of ``V = num_embeddings`` tokens.

    Each rank allocates ``ceil(V / size)`` rows; the last rank's real rows stop at ``V``
    (``end - start`` may be smaller than ``num_embeddings_tp``; it is never negative).
    """
    raise NotImplementedError("Exercise 461: implement vocab_range")


def shard_vocab(weight: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rank's rows of an embedding or LM head ``[V, hidden]`` -> ``[ceil(V / size), hidden]``.

    Rows past ``V`` (last rank, when ``size`` does not divide ``V``) are zeros: a padded
    row is never looked up, and its logit is cut off after the all-gather.
    """
    raise NotImplementedError("Exercise 461: implement shard_vocab")
