"""Exercise 481: padding a decode batch to a captured size, and replaying its graph.

No GPU needed here: the runner is built with no sizes (it captures nothing), then given
sizes and stand-in "graphs" whose ``replay`` computes logits from the static buffers,
exactly the contract a captured CUDA graph has. The chapter 18 tests replay real graphs.
"""

from __future__ import annotations

import random
from typing import List

import torch

from minisgl.benchmark.manual import make_req
from minisgl.core import Batch
from minisgl.engine.graph import GraphRunner, padded_batch_size

VOCAB, MAX_BS, DUMMY_SLOT = 5, 8, 999


class Backend:
    """Records calls; stands in for the attention backend."""

    def __init__(self, log: List[str]) -> None:
        self.log = log
        self.replanned: List[int] = []

    def prepare_for_replay(self, batch: Batch) -> None:
        self.log.append(f"prepare_for_replay({batch.padded_size})")
        self.replanned.append(batch.padded_size)


class FakeGraph:
    """Replay writes outputs[bs][i] = [ids[i], positions[i], out_loc[i], 0, 0] from the
    runner's static buffers, as a captured graph reads the addresses it was captured on."""

    def __init__(self, runner: GraphRunner, bs: int, log: List[str]) -> None:
        self.runner, self.bs, self.log = runner, bs, log
        self.ids, self.pos, self.loc = (
            runner.input_ids,
            runner.positions,
            runner.out_loc,
        )  # captured addresses

    def replay(self) -> None:
        self.log.append(f"replay({self.bs})")
        out = self.runner.outputs[self.bs]
        out.zero_()
        out[:, 0] = self.ids[: self.bs].float()
        out[:, 1] = self.pos[: self.bs].float()
        out[:, 2] = self.loc[: self.bs].float()


def runner_with(sizes: List[int], log: List[str] | None = None) -> GraphRunner:
    log = [] if log is None else log
    dummy = make_req(7, [0], cached_len=0)
    runner = GraphRunner(
        model=None,
        attn_backend=Backend(log),
        stream=None,
        device=torch.device("cpu"),  # type: ignore[arg-type]
        dummy_req=dummy,
        graph_bs=[],
        max_seq_len=64,
    )
    runner.graph_bs = sorted(sizes)  # what _capture would have captured
    runner.input_ids = torch.zeros(MAX_BS, dtype=torch.int32)
    runner.positions = torch.zeros(MAX_BS, dtype=torch.int32)
    runner.out_loc = torch.full((MAX_BS,), DUMMY_SLOT, dtype=torch.int32)
    runner.outputs = {bs: torch.zeros(bs, VOCAB) for bs in sizes}
    runner.graphs = {bs: FakeGraph(runner, bs, log) for bs in sizes}  # type: ignore[misc]
    return runner


def decode_batch(n: int, start: int = 0) -> Batch:
    return Batch([make_req(start + i, [1, 2, 3], cached_len=2) for i in range(n)], "decode")


def fill(batch: Batch, base: int) -> None:
    """The batch's padded inputs, as the scheduler prepares them (row i: ids base+i, ...)."""
    n = batch.padded_size
    batch.input_ids = torch.arange(base, base + n, dtype=torch.int32)
    batch.positions = torch.arange(10, 10 + n, dtype=torch.int32)
    batch.out_loc = torch.tensor(
        [100 + i if i < batch.size else DUMMY_SLOT for i in range(n)], dtype=torch.int32
    )


# ---- padded_batch_size -----------------------------------------------------------------


def test_a_batch_pads_to_the_next_captured_size():
    sizes = [1, 2, 4, 8, 16, 24]
    got = [padded_batch_size(n, sizes) for n in (1, 2, 3, 5, 8, 9, 17, 24)]
    assert got == [1, 2, 4, 8, 8, 16, 24, 24], (
        f"sizes {sizes}: batches 1, 2, 3, 5, 8, 9, 17, 24 pad to {got}"
    )


def test_drawn_batches_pad_to_the_smallest_graph_that_holds_them(drawn_seed):
    """Captured sizes and batches drawn at random (each judged run draws new ones)."""
    rng = random.Random(drawn_seed)
    for _ in range(50):
        sizes = sorted(rng.sample(range(1, 65), rng.randint(0, 8)))
        n = rng.randint(1, 70)
        want = min([s for s in sizes if s >= n], default=n)
        got = padded_batch_size(n, sizes)
        assert got == want, f"sizes {sizes}: a batch of {n} pads to {want}, got {got}"


def test_a_batch_bigger_than_every_graph_keeps_its_size():
    assert padded_batch_size(25, [1, 2, 4, 8, 16, 24]) == 25
    assert padded_batch_size(3, []) == 3, "no graphs: nothing to pad to"


# ---- pad_batch -----------------------------------------------------------------------


def test_pad_batch_uses_the_dummy_request():
    runner = runner_with([1, 2, 4, 8])
    batch = decode_batch(3)
    reqs = list(batch.reqs)
    runner.pad_batch(batch)
    assert batch.padded_size == 4, (
        f"3 requests pad to the graph of 4, padded_size is {batch.padded_size}"
    )
    assert batch.padded_reqs[:3] == reqs, "the real requests come first, in order"
    assert batch.padded_reqs[3] is runner.dummy_req, (
        f"pad with runner.dummy_req, got {batch.padded_reqs[3]!r:.80}"
    )
    assert batch.reqs == reqs and batch.size == 3, (
        "batch.reqs must not change: only padded_reqs grows"
    )


def test_a_batch_of_a_captured_size_is_not_padded():
    runner = runner_with([1, 2, 4, 8])
    batch = decode_batch(4)
    runner.pad_batch(batch)
    assert batch.padded_size == 4 and runner.dummy_req not in batch.padded_reqs


def test_padding_to_the_largest_graph():
    runner = runner_with([1, 2, 4, 8])
    batch = decode_batch(5)
    runner.pad_batch(batch)
    assert batch.padded_size == 8 and batch.padded_reqs[5:] == [runner.dummy_req] * 3, (
        f"5 requests pad to 8 with three dummies, got {batch.padded_size}"
    )


def test_prefill_batches_are_never_padded():
    runner = runner_with([1, 2, 4, 8])
    batch = Batch([make_req(i, [1, 2, 3]) for i in range(3)], "prefill")
    runner.pad_batch(batch)
    assert batch.padded_reqs == batch.reqs and batch.padded_size == 3, (
        "prefill runs eagerly: no padding"
    )


def test_too_big_a_batch_runs_eagerly():
    runner = runner_with([1, 2, 4])
    batch = decode_batch(6)
    runner.pad_batch(batch)
    assert batch.padded_size == 6 and runner.dummy_req not in batch.padded_reqs, (
        f"6 requests, largest graph 4: run eagerly, unpadded; padded_size is {batch.padded_size}"
    )


def test_no_graphs_no_padding():
    runner = runner_with([])
    batch = decode_batch(3)
    runner.pad_batch(batch)
    assert batch.padded_size == 3


# ---- can_use_cuda_graph ------------------------------------------------------------------


def test_which_batches_can_use_a_graph():
    runner = runner_with([1, 2, 4])
    small = decode_batch(3)
    runner.pad_batch(small)
    assert runner.can_use_cuda_graph(small), "a decode batch padded to 4 has the graph of 4"
    big = decode_batch(5)
    runner.pad_batch(big)
    assert not runner.can_use_cuda_graph(big), "no graph of 5"
    prefill = Batch([make_req(0, [1, 2, 3])], "prefill")
    assert not runner.can_use_cuda_graph(prefill), (
        "a prefill batch of 1 must not replay the decode graph of 1"
    )


# ---- replay --------------------------------------------------------------------------------


def test_replay_copies_into_the_static_buffers():
    runner = runner_with([2, 4, 8])
    ids, pos, loc = runner.input_ids, runner.positions, runner.out_loc
    batch = decode_batch(3)
    runner.pad_batch(batch)
    fill(batch, base=50)
    runner.replay(batch)
    assert runner.input_ids is ids and runner.positions is pos and runner.out_loc is loc, (
        "replay replaced a static buffer: a graph keeps reading the tensor it was captured on; copy_ into it"
    )
    assert ids[:4].tolist() == [50, 51, 52, 53] and pos[:4].tolist() == [10, 11, 12, 13], (
        f"the first 4 entries must hold the batch: input_ids {ids[:4].tolist()}, positions {pos[:4].tolist()}"
    )
    assert loc[:4].tolist() == [100, 101, 102, DUMMY_SLOT], f"out_loc {loc[:4].tolist()}"


def test_replay_replans_attention_before_the_graph():
    log: List[str] = []
    runner = runner_with([2, 4, 8], log)
    batch = decode_batch(3)
    runner.pad_batch(batch)
    fill(batch, base=0)
    runner.replay(batch)
    assert log == ["prepare_for_replay(4)", "replay(4)"], (
        f"calls were {log}: re-plan the backend (prepare_for_replay) once, then replay the graph of 4"
    )


def test_replay_returns_only_the_real_rows():
    runner = runner_with([2, 4, 8])
    batch = decode_batch(3)
    runner.pad_batch(batch)
    fill(batch, base=50)
    logits = runner.replay(batch)
    assert tuple(logits.shape) == (3, VOCAB), (
        f"logits of the 3 real requests: [3, {VOCAB}], got {tuple(logits.shape)}"
    )
    assert logits[:, 0].tolist() == [50, 51, 52] and logits[:, 2].tolist() == [100, 101, 102], (
        f"rows must be this batch's, from the graph of 4: got {logits[:, :3].tolist()}"
    )


def test_a_smaller_batch_after_a_bigger_one():
    runner = runner_with([1, 2, 4, 8])
    big = decode_batch(7)
    runner.pad_batch(big)
    fill(big, base=200)
    runner.replay(big)
    small = decode_batch(2, start=3)
    runner.pad_batch(small)
    fill(small, base=7)
    logits = runner.replay(small)
    assert logits[:, 0].tolist() == [7, 8], (
        f"the graph of 2 must see this batch's ids, got {logits[:, 0].tolist()}"
    )
    assert runner.attn_backend.replanned == [8, 2]  # type: ignore[attr-defined]
