"""Chapter 18: CUDA graphs for decode.

On the CPU: which batch sizes are captured, how a batch is padded with the dummy request,
and that padding changes nothing for the real rows (the torch backend runs a padded batch
eagerly). On a GPU: greedy output with graphs on and off is identical, a padded batch
replays the next captured size, ``cuda_graph_max_bs=0`` and the torch backend keep graphs
off.
"""

from __future__ import annotations

import pytest
import torch

from minisgl.benchmark import manual
from minisgl.core import Batch, SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.engine.graph import determine_graph_bs, padded_batch_size
from tests.helpers import MODELS, SMOLLM2, hf_encode

SHAPED = MODELS / "qwen3-0.6b-shaped"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "1 + 1 =", "Once upon a time,"]


# --------------------------------------------------------------------------- CPU


def test_default_sizes_are_powers_of_two_then_steps_of_eight():
    assert determine_graph_bs(None, None, 256) == [1, 2, 4] + list(range(8, 257, 8))
    assert determine_graph_bs(None, 20, 256) == [1, 2, 4, 8, 16, 20]
    assert determine_graph_bs(None, None, 6) == [1, 2, 4, 6]  # never more than can run at once


def test_zero_disables_graphs_and_explicit_sizes_win():
    assert determine_graph_bs(None, 0, 256) == []
    assert determine_graph_bs((16, 1, 4, 4, 512), None, 256) == [1, 4, 16]
    with pytest.raises(ValueError, match=">= 1"):
        determine_graph_bs((0, 2), None, 8)


def test_the_server_takes_cuda_graph_max_bs():
    from minisgl.server.args import parse_args

    assert parse_args(["--model", "m", "--cuda-graph-max-bs", "0"], "/tmp").cuda_graph_max_bs == 0
    assert (
        parse_args(["--model", "m"], "/tmp").cuda_graph_max_bs is None
    )  # the engine's default (256)
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--cuda-graph-max-bs", "-1"], "/tmp")


def test_a_batch_pads_to_the_next_captured_size():
    sizes = [1, 2, 4, 8, 16, 24]
    assert [padded_batch_size(n, sizes) for n in (1, 3, 5, 9, 17, 24)] == [1, 4, 8, 16, 24, 24]
    assert padded_batch_size(25, sizes) == 25  # too big: runs eagerly, unpadded


@pytest.fixture(scope="module")
def cpu_engine(qwen3_path):
    eng = Engine(
        EngineConfig(
            str(qwen3_path),
            dtype=torch.float32,
            device="cpu",
            max_running_req=8,
            num_page_override=256,
            max_seq_len_override=64,
        )
    )
    yield eng
    eng.shutdown()


def test_the_cpu_engine_captures_nothing(cpu_engine):
    runner = cpu_engine.graph_runner
    assert runner.graphs == {} and runner.max_graph_bs == 0
    batch = Batch([manual.make_req(0, [1, 2, 3], cached_len=2)], "decode")
    runner.pad_batch(batch)
    assert batch.padded_reqs is batch.reqs and not runner.can_use_cuda_graph(batch)


def test_padding_uses_the_dummy_request_for_decode_only(cpu_engine):
    runner = cpu_engine.graph_runner
    runner.graph_bs = [1, 2, 4]  # pretend these were captured: pad_batch only reads the list
    try:
        reqs = [manual.make_req(i, [1, 2, 3], cached_len=2) for i in range(3)]
        decode = Batch(reqs, "decode")
        runner.pad_batch(decode)
        assert (
            decode.padded_size == 4
            and decode.padded_reqs[3] is cpu_engine.dummy_req
            and decode.size == 3
        )
        prefill = Batch(reqs, "prefill")
        runner.pad_batch(prefill)
        assert prefill.padded_reqs is prefill.reqs
        big = Batch([manual.make_req(i, [1, 2], cached_len=1) for i in range(5)], "decode")
        runner.pad_batch(big)
        assert big.padded_size == 5
    finally:
        runner.graph_bs = []


def test_a_padded_batch_gives_the_real_rows_the_same_logits(cpu_engine, qwen3_path):
    """The dummy's KV goes to the dummy page, so it cannot disturb the real requests."""
    ids = [hf_encode(qwen3_path, p) for p in PROMPTS[:3]]
    reqs = manual.place(cpu_engine, ids, 3)
    tokens, _ = manual.greedy(cpu_engine, reqs, 2)
    plain = manual.forward(cpu_engine, manual.build_batch(cpu_engine, reqs, "decode"))

    reqs = manual.place(cpu_engine, ids, 3)
    manual.greedy(cpu_engine, reqs, 2, forced=tokens)
    cpu_engine.graph_runner.graph_bs = [4]
    try:
        batch = manual.build_batch(cpu_engine, reqs, "decode")
    finally:
        cpu_engine.graph_runner.graph_bs = []
    assert (
        batch.padded_size == 4
        and batch.out_loc[3] == cpu_engine.page_table[cpu_engine.dummy_req.table_idx, 0]
    )
    padded = manual.forward(cpu_engine, batch)
    torch.testing.assert_close(padded, plain, rtol=1e-4, atol=1e-3)  # float32 GEMM of 4 rows vs 3


# --------------------------------------------------------------------------- GPU


def _gpu_model():
    path = next((p for p in (SHAPED, SMOLLM2) if (p / "config.json").is_file()), None)
    if path is None:
        pytest.skip("no bf16 model built: python -m tools.models qwen3-0.6b-shaped")
    return path


def _llm(path, **kw):
    """FlashInfer attention unless ``kw`` says otherwise (``auto`` would send small batches
    to a faster backend where one registers)."""
    from minisgl.llm import LLM

    return LLM(
        str(path),
        dtype=torch.bfloat16,
        device="cuda",
        max_running_req=16,
        max_seq_len_override=512,
        kv_memory_cap=1 << 30,
        **{"attention_backend": "fi", **kw},
    )


@pytest.mark.gpu
def test_greedy_output_is_identical_with_graphs_on_and_off():
    """Four requests of equal length decode at batch 4, a captured size: no padding, so
    the graph runs exactly the kernels the eager pass runs, FlashInfer's decode on tensor
    cores in both (chapter 17's ``decode_wrapper_for``)."""
    path = _gpu_model()
    ids = [hf_encode(path, p) for p in PROMPTS]
    outputs = {}
    for max_bs in (16, 0):
        llm = _llm(path, cuda_graph_max_bs=max_bs)
        assert bool(llm.engine.graph_runner.graphs) == (max_bs > 0)
        outputs[max_bs] = [
            o["token_ids"]
            for o in llm.generate(ids, SamplingParams(max_tokens=32, ignore_eos=True))
        ]
        llm.shutdown()
        del llm
    assert outputs[16] == outputs[0]


@pytest.mark.gpu
def test_a_padded_batch_replays_the_next_graph():
    path = _gpu_model()
    engine = Engine(
        EngineConfig(
            str(path),
            dtype=torch.bfloat16,
            device="cuda",
            max_running_req=8,
            num_page_override=2048,
            max_seq_len_override=256,
            cuda_graph_bs=(1, 4, 8),
            attention_backend="fi",
        )
    )
    ids = [hf_encode(path, p) for p in PROMPTS[:3]]
    reqs = manual.place(engine, ids, 4)
    tokens, eager = manual.greedy(engine, reqs, 4, use_graph=False)
    reqs = manual.place(engine, ids, 4)
    replays = []
    original = engine.graph_runner.replay
    engine.graph_runner.replay = lambda b: replays.append(b.padded_size) or original(b)  # type: ignore[method-assign]
    _, graphed = manual.greedy(engine, reqs, 4, forced=tokens)
    assert replays == [4, 4, 4]  # three decode steps of 3 requests, each padded to 4
    for a, b in zip(graphed[1:], eager[1:]):
        diff = (a - b).abs().max() / (b.max() - b.min())
        assert diff < 0.02, f"graph vs eager logits differ by {float(diff):.3%} of the range"
    engine.shutdown()


@pytest.mark.gpu
def test_graphs_stay_off_with_the_torch_backend_or_max_bs_zero():
    path = _gpu_model()
    for kw in (dict(attention_backend="torch"), dict(cuda_graph_max_bs=0)):
        engine = Engine(
            EngineConfig(
                str(path),
                dtype=torch.bfloat16,
                device="cuda",
                max_running_req=4,
                num_page_override=512,
                max_seq_len_override=128,
                **kw,
            )
        )
        assert engine.graph_runner.graphs == {}, kw
        engine.shutdown()


def test_the_dummy_request_reads_only_the_dummy_page():
    """FlashInfer's index of a batch of the dummy request alone: the dummy page, one slot."""
    from minisgl.attention.fi import paged_kv_index
    from minisgl.core import Req

    num_pages, page = 10, 4
    table = torch.zeros(3, 32, dtype=torch.int32)
    table[2].fill_(num_pages * page)  # what Engine writes into the dummy row
    dummy = Req(torch.zeros(1, dtype=torch.int32), 2, 0, 4, -1, SamplingParams())
    index = paged_kv_index(table, [dummy], page)
    assert index.kv_page_ids.tolist() == [num_pages] and index.kv_last_page_len.tolist() == [1]
