"""Chapter 7, exercise 1: what goes wrong with a "decode first" policy?

Runs the real scheduler managers (PrefillManager, DecodeManager, CacheManager,
TableManager) step by step on the CPU, with the model replaced by "every request gets one
token per step", and compares three ways of choosing each step's batch:

* ``prefill-first`` — the engine's policy: prefill whenever a request waits, else decode;
* ``decode-first`` — decode whenever anything decodes, prefill only when nothing does;
* ``decode-first, cap N`` — decode first, but never more than N decode steps in a row.

A long generation (uid 0, 400 tokens) starts first; short requests arrive every few steps.
Under decode-first none of them gets its first token before uid 0 finishes: the time to
first token (TTFT) grows with the longest running generation, i.e. it is unbounded. The
cap bounds TTFT by N steps without lengthening the run.

Run: ``python solutions/ch07_decode_first.py``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minisgl.core import Batch, SamplingParams  # noqa: E402
from minisgl.message import UserMsg  # noqa: E402
from minisgl.scheduler.cache import CacheManager  # noqa: E402
from minisgl.scheduler.decode import DecodeManager  # noqa: E402
from minisgl.scheduler.prefill import ChunkedReq, PrefillManager  # noqa: E402
from minisgl.scheduler.table import TableManager  # noqa: E402

# (arrival step, uid, prompt tokens, max_tokens)
WORKLOAD: List[Tuple[int, int, int, int]] = [(0, 0, 16, 400)] + [
    (2 + 5 * i, 1 + i, 8, 20) for i in range(12)
]


@dataclass
class Managers:
    prefill: PrefillManager
    decode: DecodeManager
    cache: CacheManager
    table: TableManager


def make_managers(rows: int = 16, num_pages: int = 8192, max_len: int = 1024) -> Managers:
    page_table = torch.zeros(rows + 1, max_len, dtype=torch.int32)
    cache = CacheManager(num_pages=num_pages, page_size=1, page_table=page_table, type="naive")
    table = TableManager(rows, page_table)
    decode = DecodeManager(page_size=1)
    return Managers(PrefillManager(cache, table, decode), decode, cache, table)


Policy = Callable[[Managers, int], Batch | None]  # (managers, decode steps in a row) -> batch


def prefill_first(m: Managers, streak: int) -> Batch | None:
    return m.prefill.schedule_next_batch(prefill_budget=512) or m.decode.schedule_next_batch()


def decode_first(m: Managers, streak: int) -> Batch | None:
    return m.decode.schedule_next_batch() or m.prefill.schedule_next_batch(prefill_budget=512)


def decode_first_capped(cap: int) -> Policy:
    def policy(m: Managers, streak: int) -> Batch | None:
        if streak >= cap and m.prefill.runnable:
            return (
                m.prefill.schedule_next_batch(prefill_budget=512) or m.decode.schedule_next_batch()
            )
        return decode_first(m, streak)

    return policy


def run(policy: Policy, workload=WORKLOAD, max_steps: int = 5000) -> Tuple[Dict[int, int], int]:
    """Simulate until every request finishes; returns ({uid: TTFT in steps}, total steps)."""
    m = make_managers()
    arrival = {uid: t for t, uid, _, _ in workload}
    first_token: Dict[int, int] = {}
    finished = 0
    streak = 0
    for step in range(max_steps):
        for t, uid, prompt, max_tokens in workload:
            if t == step:
                ids = torch.arange(1, prompt + 1, dtype=torch.int32)
                m.prefill.add_one_req(
                    UserMsg(
                        uid=uid,
                        input_ids=ids,
                        sampling_params=SamplingParams(max_tokens=max_tokens),
                    )
                )
        batch = policy(m, streak)
        if batch is None:
            if finished == len(workload):
                return {u: first_token[u] - arrival[u] for u in sorted(first_token)}, step
            continue
        streak = streak + 1 if batch.is_decode else 0
        m.cache.allocate_paged(batch.reqs)
        for req in batch.reqs:  # the "forward pass": every request gets one token
            req.complete_one()
        for req in batch.reqs:
            if isinstance(req, ChunkedReq):
                continue
            req.append_host(torch.tensor([7], dtype=torch.int32))
            first_token.setdefault(req.uid, step)
            if len(req.input_ids) >= req.max_device_len:
                m.decode.remove_req(req)
                m.cache.cache_req(req, finished=True)
                m.table.free(req.table_idx)
                finished += 1
            elif batch.is_prefill:
                m.cache.cache_req(req, finished=False)
        m.decode.filter_reqs(
            r for r in batch.reqs if r.remain_len > 0 and not isinstance(r, ChunkedReq)
        )
    raise RuntimeError(f"not finished after {max_steps} steps")


def main() -> None:
    policies = [
        ("prefill-first", prefill_first),
        ("decode-first", decode_first),
        ("decode-first, cap 8", decode_first_capped(8)),
    ]
    print(
        f"{'policy':<22}{'mean TTFT':>10}{'max TTFT':>10}{'steps':>8}   TTFT of the short requests (steps)"
    )
    for name, policy in policies:
        ttft, steps = run(policy)
        short = [ttft[u] for u in ttft if u != 0]
        print(f"{name:<22}{sum(short) / len(short):>10.1f}{max(short):>10}{steps:>8}   {short}")


if __name__ == "__main__":
    main()
