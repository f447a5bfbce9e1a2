"""Rows of the page table and the token pool: one per running request.

Mirrors upstream ``minisgl.scheduler.table.TableManager``.
"""

from __future__ import annotations

import torch


class TableManager:
    """Hands out rows (``table_idx``) of two device tables of the same shape
    ``[max_running_req + 1, max_seq_len]``:

    * ``page_table[row, pos]`` — the KV slot of token ``pos`` (owned by the engine);
    * ``token_pool[row, pos]`` — the token id at ``pos``, so a step's input can be gathered
      on the device and each sampled token written back there without the CPU.

    The last row belongs to the dummy request that pads CUDA-graph batches (chapter 18);
    it is never handed out.
    """

    def __init__(self, max_running_reqs: int, page_table: torch.Tensor) -> None:
        raise NotImplementedError("Exercise 141: implement TableManager.__init__")

    @property
    def available_size(self) -> int:
        """Rows free for new requests."""
        raise NotImplementedError("Exercise 141: implement TableManager.available_size")

    def allocate(self) -> int:
        """Take a free row.

        Raises:
            RuntimeError: when every row is in use (callers check ``available_size`` first).
        """
        raise NotImplementedError("Exercise 141: implement TableManager.allocate")

    def free(self, slot: int) -> None:
        """Return row ``slot``.

        Raises:
            ValueError: for a row outside the table or one that is already free.
        """
        raise NotImplementedError("Exercise 141: implement TableManager.free")
