"""Rows of the page table and the token pool: one per running request.

Mirrors upstream ``minisgl.scheduler.table.TableManager``.
"""

from __future__ import annotations

from typing import List

import torch


class TableManager:
    """Hands out rows (``table_idx``) of two device tables of the same shape
    ``[R, align_up(max_seq_len, 32)]`` (the engine pads the columns):

    * ``page_table[row, pos]`` — the KV slot of token ``pos`` (owned by the engine);
    * ``token_pool[row, pos]`` — the token id at ``pos``, so a step's input can be gathered
      on the device and each sampled token written back there without the CPU.

    Rows ``0 .. max_running_reqs - 1`` are handed out; any further rows never are.
    """

    def __init__(self, max_running_reqs: int, page_table: torch.Tensor) -> None:
        if page_table.shape[0] < max_running_reqs:
            raise ValueError("the page table has fewer rows than max_running_reqs")
        self._max_running_reqs = max_running_reqs
        # popped from the end: row 0 is handed out first
        self._free_slots: List[int] = list(range(max_running_reqs - 1, -1, -1))
        self.page_table = page_table
        # token id 0 everywhere: a position never written still holds a valid id
        self.token_pool = torch.zeros_like(page_table, dtype=torch.int32)

    @property
    def available_size(self) -> int:
        """Rows free for new requests."""
        return len(self._free_slots)

    def allocate(self) -> int:
        """Take a free row.

        Raises:
            RuntimeError: when every row is in use (callers check ``available_size`` first).
        """
        if not self._free_slots:
            raise RuntimeError("no free row in the request table")
        return self._free_slots.pop()

    def free(self, slot: int) -> None:
        """Return row ``slot``.

        Raises:
            ValueError: for a row outside the table or one that is already free.
        """
        if not 0 <= slot < self._max_running_reqs or slot in self._free_slots:
            raise ValueError(f"row {slot} is not an allocated row of the request table")
        self._free_slots.append(slot)
