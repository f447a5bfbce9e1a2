"""Chapter 17: FlashInfer attention and kernels, against the torch reference.

On the CPU: the paged-KV index FlashInfer is planned with (a pure function of the page
table), the tensor-core rule, and the kernel dispatch. On a GPU (``@pytest.mark.gpu``):
logits of the FlashInfer backend against the torch backend on the same bf16 batch, page
sizes 1 and 16, a cached prefix, the hybrid backends, FlashInfer's norms/RoPE/activation
and sampler against the torch references, per-request seeds and logprobs on the GPU engine,
and SmolLM2 against Hugging Face on the GPU.

Why a tolerance and not equality: in bf16 two correct attention kernels that add in a
different order differ by a few units in the last place of each activation, and 28
layers carry that to the logits. We compare each step's logits with the same inputs
(teacher forcing) and allow ``LOGIT_TOL`` of the step's logit range: far above rounding
noise, far below any real bug (a wrong page, a missing causal mask, a stale plan), all
of which move logits by tens of percent.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from minisgl.attention.fi import TENSOR_CORE_MAX_BATCH, paged_kv_index, use_tensor_cores
from minisgl.core import Req, SamplingParams
from minisgl.engine import Sampler
from minisgl.env import ENV
from minisgl.kernel import serves, torch_ops
from tests.helpers import MODELS, SMOLLM2, hf_encode
from tests.test_ch06_engine import batch_of

LOGIT_TOL = 0.02  # of the step's logit range (max - min), per element
SHAPED = MODELS / "qwen3-0.6b-shaped"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "1 + 1 =",
    "Once upon a time, in a small village by the sea,",
]


def _req(row: int, length: int, cached: int = 0) -> Req:
    return Req(torch.zeros(length, dtype=torch.int32), row, cached, 4, row, SamplingParams(), None)  # type: ignore[arg-type]


def _shuffled_page_table(rows: int, cols: int, page: int, seed: int = 0) -> torch.Tensor:
    """Every row gets random distinct pages, token slots page * P + offset, as CacheManager does."""
    gen = torch.Generator().manual_seed(seed)
    per_row = -(-cols // page)
    order = torch.randperm(rows * per_row, generator=gen)
    table = torch.zeros(rows, cols, dtype=torch.int32)
    for r in range(rows):
        pages = order[r * per_row : (r + 1) * per_row]
        table[r] = (pages.unsqueeze(1) * page + torch.arange(page)).flatten()[:cols].to(torch.int32)
    return table


def _slots_from_index(index, i: int, page: int) -> torch.Tensor:
    """Undo the index: the token slots of request i, in order."""
    pages = index.kv_page_ids[index.kv_indptr[i] : index.kv_indptr[i + 1]].long()
    slots = (pages.unsqueeze(1) * page + torch.arange(page)).flatten()
    used = (len(pages) - 1) * page + int(index.kv_last_page_len[i])
    return slots[:used]


# --------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("page", [1, 4, 16])
def test_page_ids_come_from_the_first_slot_of_each_page(page):
    table = _shuffled_page_table(rows=3, cols=64, page=page)
    reqs = [_req(0, 1), _req(1, 17), _req(2, 64)]
    index = paged_kv_index(table, reqs, page)
    for i, r in enumerate(reqs):
        assert torch.equal(
            _slots_from_index(index, i, page), table[r.table_idx, : r.device_len].long()
        )
    assert index.kv_indptr.tolist() == [
        0,
        *torch.tensor([-(-n // page) for n in (1, 17, 64)]).cumsum(0).tolist(),
    ]


def test_index_of_random_batches_reconstructs_every_slot():
    rng = random.Random(0)
    for trial in range(50):
        page = rng.choice([1, 2, 4, 8, 16, 256])
        cols = page * rng.randint(1, 8) if page < 256 else 512
        table = _shuffled_page_table(rows=8, cols=cols, page=page, seed=trial)
        reqs = []
        for row in rng.sample(range(8), rng.randint(1, 8)):
            length = rng.randint(1, cols)
            reqs.append(_req(row, length, rng.randint(0, length - 1)))
        index = paged_kv_index(table, reqs, page)
        assert index.qo_indptr.tolist()[-1] == sum(r.extend_len for r in reqs)
        assert index.seq_lens.tolist() == [r.device_len for r in reqs]
        assert all(1 <= n <= page for n in index.kv_last_page_len.tolist())
        for i, r in enumerate(reqs):
            assert torch.equal(
                _slots_from_index(index, i, page), table[r.table_idx, : r.device_len].long()
            )


def test_queries_count_only_the_uncached_tokens():
    table = _shuffled_page_table(rows=2, cols=32, page=4)
    index = paged_kv_index(table, [_req(0, 20, cached=12), _req(1, 7)], 4)
    assert index.qo_indptr.tolist() == [0, 8, 15]  # 20 - 12 new tokens, then 7
    assert index.kv_indptr.tolist() == [0, 5, 7]  # the KV covers the cached prefix too
    assert index.kv_last_page_len.tolist() == [4, 3]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="page_size"):
        paged_kv_index(torch.zeros(1, 4, dtype=torch.int32), [], 1)


def test_tensor_cores_from_a_group_of_four_and_for_a_group_of_two_up_to_its_batch():
    assert not any(use_tensor_cores(9, 3, bs) for bs in (None, 1, 8, 64, 256))  # SmolLM2
    assert use_tensor_cores(32, 8) and use_tensor_cores(64, 8, 256)  # Llama-3-8B and larger
    limit = TENSOR_CORE_MAX_BATCH[2]  # Qwen3-0.6B: 16 query heads over 8
    assert use_tensor_cores(16, 8, 8) and use_tensor_cores(16, 8, limit)
    assert not use_tensor_cores(16, 8, limit + 1) and not use_tensor_cores(16, 8, 256)
    assert not use_tensor_cores(16, 8)  # no batch size: the group alone decides
    assert use_tensor_cores(8, 4, 8) and not use_tensor_cores(8, 4)  # a group, not head counts


def test_kernels_stay_on_torch_on_the_cpu():
    from minisgl import kernel

    for x in (torch.randn(4, 8), torch.randn(4, 8).bfloat16()):
        assert (
            not serves("flashinfer", x) and kernel.library_for("rms_norm", x, x[0], 1e-6) == "torch"
        )


def test_the_engine_picks_torch_attention_without_cuda(qwen3_path):
    from minisgl.engine import Engine, EngineConfig

    eng = Engine(
        EngineConfig(
            str(qwen3_path),
            dtype=torch.float32,
            device="cpu",
            max_running_req=2,
            num_page_override=16,
            max_seq_len_override=16,
        )
    )
    assert type(eng.attn_backend).__name__ == "TorchAttnBackend"
    assert eng.graph_runner.graph_bs == [] and not eng.graph_runner.graphs  # +ch18
    eng.shutdown()


# --------------------------------------------------------------------------- GPU helpers


def _gpu_models():
    return [
        pytest.param(
            p,
            id=p.name,
            marks=pytest.mark.skipif(
                not (p / "config.json").is_file(), reason=f"{p} not built (python -m tools.models)"
            ),
        )
        for p in (SHAPED, SMOLLM2)
    ]


def _engine(path, page_size=1, backend="fi", **kw):
    from minisgl.engine import Engine, EngineConfig

    return Engine(
        EngineConfig(
            str(path),
            dtype=torch.bfloat16,
            device="cuda",
            page_size=page_size,
            max_running_req=8,
            num_page_override=4096 // page_size,
            max_seq_len_override=512,
            attention_backend=backend,
            cuda_graph_max_bs=0,  # +ch18
            **kw,
        )
    )


def _swap_backend(engine, name):
    from minisgl.attention import create_attention_backend

    engine.attn_backend = engine.ctx.attn_backend = create_attention_backend(
        name, engine.config.model_config
    )


def assert_logits_close(
    a: torch.Tensor, b: torch.Tensor, tol: float = LOGIT_TOL, what: str = "logits"
) -> None:
    """Shapes first, then the largest difference relative to the logit range, and where."""
    assert a.shape == b.shape, f"{what}: shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}"
    diff = (a.float() - b.float()).abs()
    scale = float(b.float().max() - b.float().min())
    worst = int(diff.argmax())
    assert float(diff.max()) <= tol * scale, (
        f"{what}: max |diff| {float(diff.max()):.4f} > {tol:.0%} of range {scale:.2f} "
        f"at flat index {worst} (row {worst // a.shape[-1]}, token {worst % a.shape[-1]})"
    )


def _teacher_forced_logits(engine, ids, steps, forced=None):
    from minisgl.benchmark import manual

    tokens, logits = manual.greedy(engine, manual.place(engine, ids, steps), steps, forced=forced)
    return tokens, logits


def test_warm_up_draws_without_touching_the_sampler_stream():
    """The engine's start-up draw (on CUDA, so FlashInfer compiles its sampling kernels before
    the first request) must not move the stream every later draw comes from."""
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(64, -1)
    params = batch_of([SamplingParams(temperature=1.0)] * 64)
    warmed, cold = Sampler(torch.device("cpu"), 3, seed=5), Sampler(torch.device("cpu"), 3, seed=5)
    before = warmed.generator.get_state()
    warmed.warm_up(torch.float32)
    assert torch.equal(warmed.generator.get_state(), before)
    assert torch.equal(
        warmed.sample(logits, warmed.prepare(params)), cold.sample(logits, cold.prepare(params))
    )


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("path", _gpu_models())
def test_flashinfer_logits_match_the_torch_backend(path, page_size):
    engine = _engine(path, page_size)
    ids = [hf_encode(path, p) for p in PROMPTS]
    tokens, fi_logits = _teacher_forced_logits(engine, ids, 6)
    _swap_backend(engine, "torch")
    _, torch_logits = _teacher_forced_logits(engine, ids, 6, forced=tokens)
    for step, (a, b) in enumerate(zip(fi_logits, torch_logits)):
        assert_logits_close(a, b, what=f"step {step} ({'prefill' if step == 0 else 'decode'})")
    engine.shutdown()


@pytest.mark.gpu
@pytest.mark.parametrize("path", _gpu_models())
def test_a_cached_prefix_gives_the_logits_of_a_full_prefill(path):
    from minisgl.benchmark import manual

    engine = _engine(path, page_size=16)
    ids = hf_encode(path, PROMPTS[3]) * 3  # long enough for several pages
    [req] = manual.place(engine, [ids], 1)
    full = manual.forward(engine, manual.build_batch(engine, [req], "prefill"))
    for cached in (16, 21, len(ids) - 1):  # page-aligned, mid-page, all but one token
        head = manual.make_req(0, ids[:cached])
        manual.forward(engine, manual.build_batch(engine, [head], "prefill"))
        tail = manual.make_req(0, ids, cached_len=cached)
        logits = manual.forward(engine, manual.build_batch(engine, [tail], "prefill"))
        assert_logits_close(logits, full, what=f"prefill after {cached} cached tokens")
    engine.shutdown()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["fi,torch", "torch,fi"])
def test_hybrid_backends_split_prefill_and_decode(name):
    from minisgl.attention.fi import FIMetadata
    from minisgl.attention.torch_backend import TorchAttnMetadata
    from minisgl.benchmark import manual

    path = next((p for p in (SHAPED, SMOLLM2) if (p / "config.json").is_file()), None)
    if path is None:
        pytest.skip("no bf16-capable model built (python -m tools.models qwen3-0.6b-shaped)")
    engine = _engine(path, backend=name)
    reqs = manual.place(engine, [hf_encode(path, p) for p in PROMPTS], 2)
    prefill = manual.build_batch(engine, reqs, "prefill")
    expect = (
        (FIMetadata, TorchAttnMetadata) if name == "fi,torch" else (TorchAttnMetadata, FIMetadata)
    )
    assert isinstance(prefill.attn_metadata, expect[0])
    manual.forward(engine, prefill)
    for r, t in zip(reqs, [1, 2, 3, 4]):
        r.append_host(torch.tensor([t], dtype=torch.int32))
    assert isinstance(manual.build_batch(engine, reqs, "decode").attn_metadata, expect[1])
    engine.shutdown()


@pytest.mark.gpu
def test_flashinfer_kernels_match_the_torch_reference():
    from minisgl.kernel import fi_ops

    if not fi_ops.flashinfer_available():
        pytest.skip("flashinfer is not installed")
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    x, w = torch.randn(37, 1024, device=dev, dtype=dt), torch.rand(1024, device=dev, dtype=dt) + 0.5
    torch.testing.assert_close(
        fi_ops.rms_norm(x, w, 1e-6), torch_ops.rms_norm(x, w, 1e-6), rtol=2e-2, atol=2e-2
    )
    qk = torch.randn(37, 24, 128, device=dev, dtype=dt)[
        :, 4:20
    ]  # a strided view, like q out of qkv
    wh = torch.rand(128, device=dev, dtype=dt) + 0.5
    torch.testing.assert_close(
        fi_ops.rms_norm(qk, wh, 1e-6), torch_ops.rms_norm(qk, wh, 1e-6), rtol=2e-2, atol=2e-2
    )
    r = torch.randn_like(x)
    ref = torch_ops.fused_add_rms_norm(x, r, w, 1e-6)
    got = fi_ops.fused_add_rms_norm(x.clone(), r.clone(), w, 1e-6)
    torch.testing.assert_close(got[1], ref[1], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got[0], ref[0], rtol=2e-2, atol=2e-2)
    gu = torch.randn(37, 2 * 3072, device=dev, dtype=dt)
    torch.testing.assert_close(
        fi_ops.silu_and_mul(gu), torch_ops.silu_and_mul(gu), rtol=2e-2, atol=2e-2
    )
    from minisgl.layers.rotary import _cos_sin_cache

    cache = _cos_sin_cache(128, 4096, 1e6, None, torch.device(dev))
    pos = torch.randint(0, 4096, (37,), device=dev, dtype=torch.int32)
    q, k = (
        torch.randn(37, 16, 128, device=dev, dtype=dt),
        torch.randn(37, 8, 128, device=dev, dtype=dt),
    )
    ref_q, ref_k = torch_ops.apply_rotary(pos, q, k, cache)
    got_q, got_k = fi_ops.apply_rotary(pos, q.clone(), k.clone(), cache)
    torch.testing.assert_close(got_q, ref_q, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(got_k, ref_k, rtol=3e-2, atol=3e-2)


@pytest.mark.gpu
def test_flashinfer_sampling_follows_the_distribution():
    from minisgl.kernel import fi_ops

    if not fi_ops.flashinfer_available():
        pytest.skip("flashinfer is not installed")
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625], device="cuda")).repeat(
        8192, 1
    )
    temps = torch.ones(8192, device="cuda")
    draws = fi_ops.sample(logits, temps, None, None, gen)
    freq = torch.bincount(draws, minlength=5).float() / 8192
    assert torch.allclose(freq, logits[0].exp(), atol=0.02), freq.tolist()
    top2 = fi_ops.sample(logits, temps, torch.full((8192,), 2, device="cuda"), None, gen)
    assert set(top2.unique().tolist()) <= {0, 1}
    nucleus = fi_ops.sample(logits, temps, None, torch.full((8192,), 0.6, device="cuda"), gen)
    assert set(nucleus.unique().tolist()) <= {0, 1}
    cold = fi_ops.sample(logits, torch.full((8192,), 0.05, device="cuda"), None, None, gen)
    assert bool((cold == 0).all())


def _shaped_llm(dtype):
    from minisgl.llm import LLM

    if not (SHAPED / "config.json").is_file():
        pytest.skip("python -m tools.models qwen3-0.6b-shaped first")
    return LLM(
        str(SHAPED),
        dtype=dtype,
        device="cuda",
        max_running_req=16,
        max_seq_len_override=256,
        kv_memory_cap=1 << 30,
    )


@pytest.mark.gpu
def test_a_seeded_request_on_the_gpu_is_the_same_alone_and_batched():
    """Chapter 6's per-request seed on CUDA: the torch draw with a CUDA generator per row,
    beside unseeded rows (FlashInfer's sampler in bf16). float32 for the batching check, so
    the logits themselves do not move with the batch; bf16 for plain reproducibility."""
    mine = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=16, ignore_eos=True, seed=7)
    others = [
        SamplingParams(
            temperature=0.8, max_tokens=8 + i, ignore_eos=True, seed=i if i % 2 else None
        )
        for i in range(7)
    ]
    for dtype in (torch.float32, torch.bfloat16):
        llm = _shaped_llm(dtype)
        alone = llm.generate([PROMPTS[0]], mine)[0]["token_ids"]
        assert llm.generate([PROMPTS[0]], mine)[0]["token_ids"] == alone
        for row in (0, 4, 7) if dtype == torch.float32 else (0,):
            prompts = [PROMPTS[1 + i % 3] for i in range(7)]
            out = llm.generate(
                prompts[:row] + [PROMPTS[0]] + prompts[row:], others[:row] + [mine] + others[row:]
            )
            assert out[row]["token_ids"] == alone, (dtype, row)
        llm.shutdown()


@pytest.mark.gpu
def test_logprobs_on_the_gpu_are_finite_ordered_and_match_the_greedy_token():
    llm = _shaped_llm(torch.bfloat16)
    params = [
        SamplingParams(max_tokens=12, ignore_eos=True, logprobs=5),
        SamplingParams(max_tokens=12),
    ]
    outs = llm.generate(PROMPTS[:2], params)
    assert "logprobs" not in outs[1]
    out = outs[0]
    assert len(out["logprobs"]) == len(out["token_ids"]) == 12
    for token, (lp, top) in zip(out["token_ids"], out["logprobs"]):
        values = [v for _, v in top]
        assert len(top) == 5 and all(math.isfinite(v) and v <= 0 for v in values)
        assert values == sorted(values, reverse=True)
        assert top[0][0] == token and abs(lp - values[0]) < 1e-6  # greedy: the most likely
    llm.shutdown()


@pytest.mark.gpu
def test_the_torch_kernels_switch_turns_fast_kernels_off():
    x = torch.randn(4, 8, device="cuda", dtype=torch.bfloat16)
    ENV.TORCH_KERNELS.value = True
    try:
        assert not serves("flashinfer", x) and not serves("triton", x)
    finally:
        ENV.TORCH_KERNELS.value = False


@pytest.mark.gpu
@pytest.mark.skipif(
    not (SMOLLM2 / "config.json").is_file(),
    reason="SmolLM2 not converted (python -m tools.models smollm2)",
)
def test_smollm2_on_gpu_agrees_with_hf_on_gpu(capsys):
    """bf16 greedy, 32 tokens: wherever the two diverge, Hugging Face's own top-2 margin
    there must be a near-tie (< 2% of its logit range), i.e. rounding picked the winner."""
    from transformers import AutoModelForCausalLM

    from minisgl.llm import LLM

    ids = [hf_encode(SMOLLM2, p) for p in PROMPTS]
    hf = AutoModelForCausalLM.from_pretrained(SMOLLM2, dtype=torch.bfloat16).cuda().eval()
    refs, margins = [], []
    with torch.no_grad():
        for p in ids:
            x = torch.tensor([p], device="cuda")
            out = hf.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=32,
                min_new_tokens=32,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
            refs.append(out.sequences[0, len(p) :].tolist())
            margins.append(
                [
                    float(t.topk(2).values[0, 0] - t.topk(2).values[0, 1])
                    / float(t.max() - t.min())
                    for t in out.logits
                ]
            )
    del hf
    llm = LLM(
        str(SMOLLM2),
        dtype=torch.bfloat16,
        device="cuda",
        max_running_req=8,
        max_seq_len_override=256,
        kv_memory_cap=1 << 30,
    )
    got = [
        o["token_ids"] for o in llm.generate(ids, SamplingParams(max_tokens=32, ignore_eos=True))
    ]
    llm.shutdown()
    for prompt, g, r, m in zip(PROMPTS, got, refs, margins):
        agree = next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), 32)
        with capsys.disabled():
            print(f"\nSmolLM2 GPU vs HF GPU (bf16) {prompt!r}: first {agree}/32 tokens agree")
        if agree < 32:
            assert m[agree] < LOGIT_TOL, (
                f"{prompt!r} diverges at token {agree} where HF's margin is {m[agree]:.3f}"
            )
