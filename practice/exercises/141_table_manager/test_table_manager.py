"""Exercise 141: TableManager on MINISGL_DEVICE (the CPU by default)."""

from __future__ import annotations

import os
import random

import pytest
import torch

from minisgl.scheduler.table import TableManager

DEVICE = torch.device(os.environ.get("MINISGL_DEVICE") or "cpu")


def make(rows: int = 4, max_len: int = 16) -> TableManager:
    return TableManager(rows, torch.zeros(rows + 1, max_len, dtype=torch.int32, device=DEVICE))


def test_rows_are_handed_out_from_zero():
    tm = make(4)
    got = [tm.allocate() for _ in range(4)]
    assert got == [0, 1, 2, 3], f"rows should come out as [0, 1, 2, 3], got {got}"


def test_available_size_follows_allocations():
    tm = make(4)
    assert tm.available_size == 4
    a = tm.allocate()
    tm.allocate()
    assert tm.available_size == 2
    tm.free(a)
    assert tm.available_size == 3 and tm.allocate() == a, "a freed row can be handed out again"


def test_exhaustion_raises():
    tm = make(2)
    tm.allocate(), tm.allocate()
    with pytest.raises(RuntimeError):
        tm.allocate()


def test_dummy_row_is_never_handed_out():
    tm = make(3)
    rows = {tm.allocate() for _ in range(3)}
    assert 3 not in rows, "the last row (index max_running_reqs) belongs to the dummy request"


def test_double_free_is_refused():
    tm = make(4)
    r = tm.allocate()
    tm.free(r)
    with pytest.raises(ValueError):
        tm.free(r)
    assert tm.available_size == 4


@pytest.mark.parametrize("row", [-1, 4, 99])
def test_foreign_row_is_refused(row):
    tm = make(4)
    with pytest.raises(ValueError):
        tm.free(row)


def test_too_small_page_table_is_refused():
    with pytest.raises(ValueError):
        TableManager(8, torch.zeros(4, 16, dtype=torch.int32, device=DEVICE))


def test_token_pool_matches_the_page_table():
    tm = make(4, max_len=16)
    pool = tm.token_pool
    assert (
        tuple(pool.shape) == (5, 16)
        and pool.dtype == torch.int32
        and pool.device.type == DEVICE.type
    ), f"token_pool: shape {tuple(pool.shape)}, dtype {pool.dtype}, device {pool.device}"
    assert int(pool.abs().sum()) == 0, "token_pool starts as zeros"
    assert tm.page_table.data_ptr() != pool.data_ptr(), "token_pool is a tensor of its own"


def test_drawn_allocations_and_frees_keep_the_rows_distinct(drawn_seed):
    """A drawn sequence of allocations and frees (each judged run draws a new one): rows
    held are distinct real rows, counted by ``available_size``; none left raises."""
    rng = random.Random(drawn_seed)
    rows = rng.randint(1, 12)
    tm, held = make(rows), []
    for _ in range(60):
        if held and rng.random() < 0.45:
            row = held.pop(rng.randrange(len(held)))
            tm.free(row)
        elif len(held) < rows:
            row = tm.allocate()
            assert 0 <= row < rows and row not in held, f"row {row} while holding {held}"
            held.append(row)
        else:
            with pytest.raises(RuntimeError):
                tm.allocate()
        assert tm.available_size == rows - len(held)
