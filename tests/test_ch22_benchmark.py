"""Chapter 22: the benchmarks.

On the CPU: the workload is exactly nano-vllm's (133,966 output tokens), the table
helper, resetting the prefix cache between runs, and a smoke run of the offline benchmark
on the tiny model. On a GPU: a short offline run and the decode-step script.
"""

from __future__ import annotations

import random

import pytest
import torch

from minisgl.benchmark import offline
from minisgl.benchmark.common import format_table
from minisgl.benchmark.workload import NANO_VLLM_OUTPUT_TOKENS, nano_vllm_workload
from tests.helpers import MODELS
from tools.diagnostics import tp_logits

SHAPED = MODELS / "qwen3-0.6b-shaped"


def test_the_workload_is_nano_vllms_exactly():
    w = nano_vllm_workload()
    assert w.num_requests == 256
    assert w.output_tokens == NANO_VLLM_OUTPUT_TOKENS == 133_966
    assert w.input_tokens == 142_827
    # the same draws, in the same order, as nano-vllm's bench.py with the global random
    random.seed(0)
    prompts = [
        [random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(256)
    ]
    assert w.prompts == prompts and w.max_tokens == [random.randint(100, 1024) for _ in range(256)]
    params = w.sampling_params()
    assert all(p.temperature == 0.6 and p.ignore_eos for p in params)
    assert [p.max_tokens for p in params] == w.max_tokens


def test_small_workloads_keep_the_shape():
    w = nano_vllm_workload(8, input_len=(4, 16), output_len=(2, 5))
    assert (
        w.num_requests == 8
        and all(4 <= len(p) <= 16 for p in w.prompts)
        and all(2 <= n <= 5 for n in w.max_tokens)
    )
    with pytest.raises(ValueError, match="min <= max"):
        nano_vllm_workload(2, input_len=(10, 5))


def test_the_table_lines_up():
    text = format_table(["system", "tok/s"], [["mini-sglang", "17,000"], ["transformers", "620"]])
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1 and lines[1].startswith("-")


def test_the_offline_benchmark_runs_on_the_cpu(qwen3_path, capsys):
    results = offline.main(
        [
            "--model",
            str(qwen3_path),
            "--device",
            "cpu",
            "--num-seqs",
            "3",
            "--input-len",
            "4",
            "12",
            "--output-len",
            "2",
            "4",
            "--page-size",
            "4",
            "--max-seq-len",
            "64",
            "--max-running-req",
            "4",
        ]
    )
    expected = nano_vllm_workload(3, input_len=(4, 12), output_len=(2, 4)).output_tokens
    assert [r.output_tokens for r in results] == [expected]
    out = capsys.readouterr().out
    assert "tok/s" in out and "start-up" in out and "KV pages x P = tokens" in out


def test_resetting_the_prefix_cache_returns_every_page(qwen3_path):
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    llm = LLM(
        str(qwen3_path),
        dtype=torch.float32,
        device="cpu",
        max_running_req=2,
        num_page_override=64,
        max_seq_len_override=32,
    )
    llm.generate([[1, 2, 3, 4, 5]], SamplingParams(max_tokens=2))
    assert llm.cache_manager.prefix_cache.size_info.total_size > 0
    offline.reset_prefix_cache(llm)
    assert llm.cache_manager.prefix_cache.size_info.total_size == 0
    assert llm.cache_manager.num_free_pages == llm.engine.num_pages
    llm.shutdown()


def test_the_decode_step_batch_is_a_pure_decode_of_the_context(qwen3_path):
    from minisgl.benchmark import manual
    from minisgl.benchmark.decode_step import kv_bytes_per_token, make_decode_batch, weight_bytes
    from minisgl.engine import Engine, EngineConfig

    eng = Engine(
        EngineConfig(
            str(qwen3_path),
            dtype=torch.float32,
            device="cpu",
            page_size=4,
            max_running_req=4,
            num_page_override=64,
            max_seq_len_override=32,
        )
    )
    batch = make_decode_batch(eng, 3, context=10)
    assert batch.is_decode and batch.size == 3 and batch.positions.tolist() == [10, 10, 10]
    assert batch.out_loc.tolist() == [10, 22, 34]  # rows own pages 0-2, 3-5, 6-8: slot 10 of each
    assert manual.forward(eng, batch).shape == (3, eng.config.model_config.vocab_size)
    mc = eng.config.model_config
    assert kv_bytes_per_token(eng) == 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * 4
    # tied embeddings: the LM head shares the embedding's storage and is counted once
    assert weight_bytes(eng) < sum(t.numel() * 4 for t in eng.model.state_dict().values())
    eng.shutdown()


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(
    not (SHAPED / "config.json").is_file(), reason="python -m tools.models qwen3-0.6b-shaped"
)
def test_a_short_offline_run_on_the_gpu():
    results = offline.main(
        [
            "--model",
            str(SHAPED),
            "--num-seqs",
            "32",
            "--input-len",
            "50",
            "200",
            "--output-len",
            "20",
            "60",
            "--cuda-graph-max-bs",
            "32",
            "--max-running-req",
            "32",
            "--memory-ratio",
            "0.5",
        ]
    )
    [r] = results
    assert (
        r.output_tokens
        == nano_vllm_workload(32, input_len=(50, 200), output_len=(20, 60)).output_tokens
    )
    assert r.peak_memory is not None and r.peak_memory > 0


@pytest.mark.gpu
@pytest.mark.skipif(
    not (SHAPED / "config.json").is_file(), reason="python -m tools.models qwen3-0.6b-shaped"
)
def test_the_decode_step_script_runs(capsys):
    from minisgl.benchmark import decode_step

    decode_step.main(
        ["--model", str(SHAPED), "--batch-sizes", "1", "8", "--context", "256", "--steps", "5"]
    )
    out = capsys.readouterr().out
    assert "floor ms" in out and "TB/s" in out


def test_kernel_names_lose_their_template_arguments_and_parameters():
    from minisgl.benchmark.step_profile import short_name

    name = (
        "void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, "
        "4u, 8u, 16u, 1u, 8u, flashinfer::DefaultAttention<false, false, false, false>, "
        "flashinfer::BatchDecodeParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int>>"
        "(flashinfer::BatchDecodeParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int>)"
    )
    assert short_name(name) == "flashinfer::BatchDecodeWithPagedKVCacheKernel"
    assert short_name("_store_kv_kernel") == "_store_kv_kernel"
    assert len(short_name("k" * 100)) == 60


@pytest.mark.gpu
@pytest.mark.skipif(
    not (SHAPED / "config.json").is_file(), reason="python -m tools.models qwen3-0.6b-shaped"
)
def test_the_step_profile_accounts_for_the_step(capsys, tmp_path):
    """The profiled kernels of a graph replay add up to about the step that CUDA events time."""
    import json

    from minisgl.benchmark import step_profile

    out = tmp_path / "profile.json"
    step_profile.main(
        ["--model", str(SHAPED), "--batch-sizes", "8", "--context", "256", "--json", str(out)]
    )
    record = json.loads(out.read_text())["8"]
    kernels_us = sum(us for _, us in record["kernels"].values())
    assert 0.5 * record["step_us"] < kernels_us < 1.5 * record["step_us"], record["step_us"]
    assert "µs each" in capsys.readouterr().out


def test_the_online_trace_is_seeded_and_only_its_gaps_depend_on_the_rate(qwen3_path):
    from transformers import AutoTokenizer

    from minisgl.benchmark.online import poisson_trace

    tok = AutoTokenizer.from_pretrained(qwen3_path)
    slow = poisson_trace(tok, 200, 2.0, (4, 8), (3, 9), seed=1)
    fast = poisson_trace(tok, 200, 50.0, (4, 8), (3, 9), seed=1)
    assert [r.prompt for r in slow] == [r.prompt for r in fast]
    assert [r.max_tokens for r in slow] == [r.max_tokens for r in fast] and all(
        3 <= r.max_tokens <= 9 for r in slow
    )
    assert slow == poisson_trace(tok, 200, 2.0, (4, 8), (3, 9), seed=1)
    gaps = [b.arrival - a.arrival for a, b in zip(slow, slow[1:])]
    assert slow[0].arrival == 0 and min(gaps) >= 0
    assert 0.35 < sum(gaps) / len(gaps) < 0.65  # exponential gaps of mean 1 / rate = 0.5 s
    assert fast[-1].arrival < slow[-1].arrival / 10


def test_online_summary_percentiles_and_throughput():
    from minisgl.benchmark.online import RequestResult, percentile, summarize

    assert percentile([5.0, 1.0, 3.0], 50) == 3.0 and percentile([], 50) != percentile(
        [], 50
    )  # NaN
    ok = RequestResult(
        sent=0.0, first=0.1, last=1.1, prompt_tokens=8, output_tokens=11
    )  # 10 gaps of 0.1 s
    failed = RequestResult(sent=0.0, error="HTTP 400: too long")
    row = summarize(4.0, [ok, failed], seconds=2.0)
    assert row[:5] == ["4", "1/2", "2.0", "6", "0.50"]  # 11 tokens / 2 s -> "6"
    assert (
        row[5] == "100 / 100 / 100"
        and row[6] == "100.0 / 100.0 / 100.0"
        and row[7] == "1.1 / 1.1 / 1.1"
    )


# ---- chapter 16's measurements: teacher-forced TP logits, the collectives' share ---------------


def _logits_run(logits: torch.Tensor, tokens) -> dict:
    return {"logits": logits, "forced_logits": logits, "tokens": tokens}


def test_tp_logits_passes_only_near_ties_within_the_tolerance(capsys):
    steps, batch, vocab = 2, len(tp_logits.PROMPTS), 5
    ref_logits = torch.zeros(steps, batch, vocab)
    ref_logits[:, :, 0], ref_logits[:, :, 1] = 10.0, 9.999  # token 0 wins by 0.001 everywhere
    ref = _logits_run(ref_logits, [[0] * steps for _ in range(batch)])
    near = ref_logits.clone()
    near[1, 3, 1] += 0.002  # prompt 3, step 1: the near-tie flips
    other = {"forced_logits": near, "tokens": [[0, 1] if b == 3 else [0, 0] for b in range(batch)]}
    assert tp_logits.compare(ref, other, 2, tolerance=0.02)
    out = capsys.readouterr().out
    assert "step 1: tp=1 picks 0, tp=2 picks 1: a near-tie, tp=1's margin 0.0010" in out
    far = ref_logits.clone()
    far[0, 2, 4] += 0.3  # 3% of the range: over the tolerance, even without a flip
    assert not tp_logits.compare(
        ref, {"forced_logits": far, "tokens": ref["tokens"]}, 2, tolerance=0.02
    )
    assert "largest |dlogit| 3.0e-02 of the logit range" in capsys.readouterr().out


@pytest.mark.slow
def test_tp_logits_at_tp2_on_gloo_equal_tp1(qwen3_path, capsys):
    assert (
        tp_logits.main(["--model", str(qwen3_path), "--tp", "2", "--device", "cpu", "--steps", "4"])
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "PASS" in out and out.count("4/4") == 8
    )  # every forced step of every prompt has tp=1's argmax


def test_collectives_off_keeps_shapes_and_restores_the_communicator():
    from minisgl.benchmark.tp_decode import collectives_off
    from minisgl.distributed import DistributedCommunicator

    before = DistributedCommunicator.all_reduce
    x = torch.ones(3, 4)
    with collectives_off():
        comm = DistributedCommunicator()
        assert comm.all_reduce(x) is x and comm.all_gather(x).shape == (
            3,
            4,
        )  # one rank, no process group
    assert DistributedCommunicator.all_reduce is before


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--model", "models/nope"],
            "no model at 'models/nope'",
        ),  # a local folder: never a hub name
        (["--tp", "3"], "cannot split the model over 3"),
        (["--steps", "0"], "--steps must be >= 1"),
    ],
)
def test_tp_logits_refuses_bad_arguments_in_one_line(qwen3_path, argv, message, capsys):
    if argv[0] != "--model":
        argv = ["--model", str(qwen3_path), *argv]
    with pytest.raises(SystemExit) as exit_info:
        tp_logits.main([*argv, "--device", "cpu"])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
