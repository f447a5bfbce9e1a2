"""Chapter 16: tensor parallelism on the CPU (gloo), checked against one rank.

The cheap tests run in this process: the shard functions, and the parallel layers with
their collectives simulated by threads. The expensive ones start real ranks: an offline
``LLM(tp=2)`` on a tiny Qwen3 whose vocabulary 2 does not divide (the padded LM head), a
``--tp 2`` and a ``--tp 4`` server (4 ranks, 2 KV heads: each head replicated on two
ranks), and a rank killed under both. SmolLM2 (9 query heads) is refused at 2 and 4.
"""

import json
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Callable, List

import httpx
import openai
import pytest
import torch
from safetensors.torch import load_file, save_file

from minisgl.core import Context, SamplingParams, set_global_ctx
from minisgl.distributed import DistributedCommunicator, set_tp_info
from minisgl.layers import (
    LinearColParallelMerged,
    LinearRowParallel,
    ParallelLMHead,
    VocabParallelEmbedding,
)
from minisgl.layers.shard import (
    check_tp_size,
    shard_column,
    shard_kv_heads,
    shard_row,
    shard_vocab,
    vocab_range,
)
from minisgl.llm import LLM
from minisgl.models.weight import shard_tensor
from minisgl.server.args import parse_args
from tests.helpers import DEVICE
from tests.test_ch15_server import Server

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "List three prime numbers:",
    "Once upon a time,",
]
MAX_TOKENS = 10
OPTIONS = dict(
    dtype=torch.float32,
    device=DEVICE,
    attention_backend="torch",
    max_seq_len_override=512,
    num_page_override=8192,
)


# ---- the cuts -----------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_column_and_row_shards_put_back_together_are_the_weight(size):
    w = torch.randn(12, 24)
    assert torch.equal(torch.cat([shard_column(w, r, size) for r in range(size)], dim=0), w)
    assert torch.equal(torch.cat([shard_row(w, r, size) for r in range(size)], dim=1), w)
    assert shard_column(w, size - 1, size).shape == (12 // size, 24)


def test_a_shard_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="5 equal blocks"):
        shard_column(torch.randn(12, 4), 0, 5)
    with pytest.raises(ValueError, match="5 equal blocks"):
        shard_row(torch.randn(4, 12), 0, 5)


def test_kv_heads_are_replicated_when_there_are_fewer_than_ranks():
    head_dim, heads = 3, 2
    w = torch.arange(heads * head_dim * 5, dtype=torch.float32).reshape(heads * head_dim, 5)
    # 4 ranks, 2 heads: ranks 0 and 1 hold head 0, ranks 2 and 3 head 1
    for rank, head in [(0, 0), (1, 0), (2, 1), (3, 1)]:
        assert torch.equal(
            shard_kv_heads(w, rank, 4, heads), w[head * head_dim : (head + 1) * head_dim]
        )
    # as many heads as ranks or more: an ordinary column cut
    assert torch.equal(shard_kv_heads(w, 1, 2, heads), w[head_dim:])


@pytest.mark.parametrize("vocab,size", [(10, 4), (12, 4), (7, 2), (5, 1)])
def test_vocab_shards_are_equal_sized_and_padded_with_zeros(vocab, size):
    w = torch.randn(vocab, 3) + 10  # no real row is zero
    shards = [shard_vocab(w, r, size) for r in range(size)]
    per_rank = -(-vocab // size)
    assert all(s.shape == (per_rank, 3) for s in shards)
    joined = torch.cat(shards)
    assert torch.equal(joined[:vocab], w) and not joined[vocab:].any()
    ranges = [vocab_range(vocab, r, size) for r in range(size)]
    assert ranges[0].start == 0 and ranges[-1].end == vocab
    assert all(a.end == b.start for a, b in zip(ranges, ranges[1:]))


def test_the_loader_cuts_columns_rows_and_replicates_kv():
    w = torch.arange(24.0).view(6, 4)
    assert torch.equal(shard_tensor("x.q_proj.weight", w, 1, 2, 2), w[3:])
    assert torch.equal(shard_tensor("x.o_proj.weight", w, 1, 2, 2), w[:, 2:])
    # 1 KV head, 2 ranks: both ranks keep the whole head
    assert torch.equal(shard_tensor("x.k_proj.weight", w, 1, 2, 1), w)


def test_smollm2_is_refused_at_2_and_4_ranks_naming_its_heads(smollm2_path, capsys):
    with pytest.raises(ValueError, match="9 query heads, 3 KV heads") as e:
        check_tp_size(9, 3, 1536, 4)
    assert "Sizes that work: 1, 3" in str(e.value)
    check_tp_size(9, 3, 1536, 3)  # 3 query heads and 1 KV head per rank
    check_tp_size(4, 2, 128, 4)  # tiny Qwen3: 1 query head per rank, each KV head on 2 ranks
    with pytest.raises(SystemExit):  # the server refuses before starting any process
        parse_args(["--model", str(smollm2_path), "--tp", "2"], "/tmp")
    assert "cannot split the model over 2 tensor-parallel ranks" in capsys.readouterr().err
    with pytest.raises(ValueError, match="over 4 tensor-parallel ranks: it has 9 query heads"):
        LLM(str(smollm2_path), tp=4, **OPTIONS)  # refused before any rank is spawned


def test_the_server_takes_tp_and_gives_the_ranks_a_meeting_place(qwen3_path):
    args = parse_args(["--model", str(qwen3_path), "--tp", "4"], "/tmp/x")
    assert (args.tp_info.rank, args.tp_info.size) == (0, 4)
    assert args.distributed_addr == "file:///tmp/x/distributed"


# ---- the layers, with collectives simulated by threads --------------------------------------


class ThreadCollectives:
    """All-reduce and all-gather between ``size`` threads, one per simulated rank."""

    def __init__(self, size: int) -> None:
        self.size, self.barrier, self.slots = size, threading.Barrier(size), [None] * size
        self.local = threading.local()

    def _exchange(self, x: torch.Tensor) -> List[torch.Tensor]:
        self.slots[self.local.rank] = x.clone()
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before all have read
        return got

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        x.copy_(torch.stack(self._exchange(x)).sum(0))
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(self._exchange(x))

    def run(self, fn: Callable[[int], torch.Tensor]) -> List[torch.Tensor]:
        out: List[torch.Tensor] = [torch.empty(0)] * self.size
        errors: List[BaseException] = []

        def body(rank: int) -> None:
            self.local.rank = rank
            try:
                out[rank] = fn(rank)
            except BaseException as e:  # noqa: BLE001 -- re-raised below
                errors.append(e)
                self.barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return out


def _build(size: int, make: Callable[[], object], weights: dict) -> List[object]:
    ops = []
    for rank in range(size):
        set_tp_info(rank, size)
        op = make()
        for name, full in weights.items():
            setattr(op, name, full(rank))
        ops.append(op)
    return ops


@pytest.fixture
def simulated(monkeypatch):
    """``ThreadCollectives`` of a given size, patched into every ``DistributedCommunicator``."""

    def make(size: int) -> ThreadCollectives:
        sim = ThreadCollectives(size)
        monkeypatch.setattr(
            DistributedCommunicator, "all_reduce", lambda self, x: sim.all_reduce(x)
        )
        monkeypatch.setattr(
            DistributedCommunicator, "all_gather", lambda self, x: sim.all_gather(x)
        )
        return sim

    yield make
    set_tp_info(0, 1)


@pytest.mark.parametrize("size", [2, 4])
def test_a_column_then_row_parallel_mlp_equals_the_full_one(simulated, size):
    torch.manual_seed(0)
    x, w_up, w_down, bias = (
        torch.randn(5, 8),
        torch.randn(16, 8),
        torch.randn(8, 16),
        torch.randn(8),
    )
    expected = (x @ w_up.T) @ w_down.T + bias
    sim = simulated(size)
    ups = _build(
        size,
        lambda: LinearColParallelMerged(8, [16], has_bias=False),
        {"weight": lambda r: shard_column(w_up, r, size)},
    )
    downs = _build(
        size,
        lambda: LinearRowParallel(16, 8, has_bias=True),
        {"weight": lambda r: shard_row(w_down, r, size), "bias": lambda r: bias},
    )
    outs = sim.run(lambda r: downs[r].forward(ups[r].forward(x)))
    for out in outs:  # every rank ends with the whole result, the bias added once
        torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("vocab,size", [(10, 4), (11, 2), (12, 4)])
def test_vocab_parallel_embedding_and_lm_head_equal_the_full_ones(simulated, vocab, size):
    torch.manual_seed(0)
    table, ids = torch.randn(vocab, 6), torch.tensor([0, vocab - 1, 3, vocab // 2, 1])
    sim = simulated(size)
    embeds = _build(
        size,
        lambda: VocabParallelEmbedding(vocab, 6),
        {"weight": lambda r: shard_vocab(table, r, size)},
    )
    heads = _build(
        size, lambda: ParallelLMHead(vocab, 6), {"weight": lambda r: shard_vocab(table, r, size)}
    )
    for out in sim.run(lambda r: embeds[r].forward(ids)):
        torch.testing.assert_close(out, table[ids])
    ctx = Context(page_size=1)
    ctx._batch = SimpleNamespace(is_prefill=False)  # decode: every row is a request's last
    set_global_ctx(ctx)
    try:
        hidden = torch.randn(3, 6)
        for logits in sim.run(lambda r: heads[r].forward(hidden)):
            assert logits.shape == (3, vocab)  # the padded rows' logits are cut off
            # regression (found on 2 H200s): FlashInfer's sampling kernels refuse a strided view
            assert logits.is_contiguous()
            torch.testing.assert_close(logits, hidden @ table.T)
    finally:
        set_global_ctx(None)


# ---- real ranks: gloo on the CPU -------------------------------------------------------------


@pytest.fixture(scope="module")
def odd_vocab_qwen3(qwen3_path, tmp_path_factory):
    """The tiny Qwen3 with one vocabulary row fewer (151,935: odd), so that 2 and 4 ranks
    do not divide it. The row dropped is a padding id no text ever produces."""
    path = tmp_path_factory.mktemp("odd") / "tiny-qwen3-odd-vocab"
    shutil.copytree(qwen3_path, path)
    weights = load_file(path / "model.safetensors")
    weights = {
        k: (v[:-1].contiguous() if "embed_tokens" in k or "lm_head" in k else v)
        for k, v in weights.items()
    }
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["vocab_size"] -= 1
    (path / "config.json").write_text(json.dumps(config))
    return path


def _greedy(llm: LLM) -> List[List[int]]:
    sp = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    return [o["token_ids"] for o in llm.generate(PROMPTS, sp)]


@pytest.mark.slow
def test_offline_llm_at_tp2_equals_tp1_with_a_padded_vocab_and_names_a_dead_rank(odd_vocab_qwen3):
    llm = LLM(str(odd_vocab_qwen3), **OPTIONS)
    expected = _greedy(llm)
    llm.shutdown()
    llm = LLM(str(odd_vocab_qwen3), tp=2, **OPTIONS)
    try:
        assert llm.engine.model.lm_head.weight.shape == (151935 // 2 + 1, 64)  # one padding row
        assert _greedy(llm) == expected
        assert _greedy(llm) == expected  # a second generate: the ranks are still in step
        victim = llm._ranks.processes[0]
        victim.kill()
        victim.join()
        t0 = time.monotonic()
        with pytest.raises(
            RuntimeError, match=f"rank 1 \\(pid {victim.pid}\\) exited with code -9"
        ):
            _greedy(llm)
        assert time.monotonic() - t0 < 30  # an error, not a hang
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def tp1_texts(qwen3_path):
    llm = LLM(str(qwen3_path), **OPTIONS)
    sp = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    texts = [o["text"] for o in llm.generate(PROMPTS, sp)]
    llm.shutdown()
    return texts


def _server_texts(server: Server) -> List[str]:
    """The prompts sent at once, so that the ranks batch them together."""

    # httpx, not the openai client: its response models build their pydantic schemas on first
    # use, and two threads doing that at once can fail inside pydantic (model_rebuild)
    def one(prompt: str) -> str:
        body = {"model": "tiny-qwen3", "prompt": prompt, "max_tokens": MAX_TOKENS}
        body.update(temperature=0, ignore_eos=True)
        r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(one, PROMPTS))


@pytest.mark.slow
def test_a_tp4_server_replicates_kv_heads_and_answers_as_one_rank(qwen3_path, tmp_path, tp1_texts):
    server = Server(qwen3_path, tmp_path / "server.log", "--tp", "4").wait_ready()
    try:
        assert {f"minisgl-scheduler-{r}" for r in range(4)} <= set(server.workers)
        assert _server_texts(server) == tp1_texts
    finally:
        assert server.stop(signal.SIGTERM) == 0, server.log.read_text()[-3000:]


@pytest.mark.slow
def test_a_tp2_server_answers_as_one_rank_and_a_dead_rank_takes_it_down(
    qwen3_path, tmp_path, tp1_texts
):
    server = Server(qwen3_path, tmp_path / "server.log", "--tp", "2").wait_ready()
    try:
        assert _server_texts(server) == tp1_texts
        client = server.client()
        stream = client.completions.create(
            model="tiny-qwen3",
            prompt="Hello",
            max_tokens=400,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        next(iter(stream))  # it is running on both ranks
        victim, peer = server.workers["minisgl-scheduler-1"], server.workers["minisgl-scheduler-0"]
        t0 = time.monotonic()
        victim.kill()
        with pytest.raises(openai.APIError, match="minisgl-scheduler-1"):
            for _ in stream:
                pass
        rc = server.proc.wait(30)  # the server stops by itself, rank 0 with it
        peer.wait(timeout=10)  # rank 0 does not linger, waiting for its peer in a collective
        assert time.monotonic() - t0 < 15
    finally:
        server.stop(signal.SIGINT, group=True)
    line = "error: worker minisgl-scheduler-1 died (exit code -9); the server stopped"
    assert rc == 1 and line in server.output(), server.output()[-2000:]
    log = server.log.read_text()
    assert "its tensor-parallel peer is gone" in log or "Connection closed by peer" in log
