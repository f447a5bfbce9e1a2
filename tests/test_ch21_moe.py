"""Chapter 21: mixture of experts (Qwen3-MoE): routing, alignment, two backends, HF equality.

On the CPU: the router against ``transformers``' ``Qwen3MoeTopKRouter``, the alignment's
invariants, the torch backend against ``Qwen3MoeSparseMoeBlock``, the expert stacking of
the loader, the tiny Qwen3-MoE against ``transformers`` greedy token for token (float32),
and the Triton kernel against the torch backend under Triton's interpreter (in a
subprocess: ``TRITON_INTERPRET`` is read when ``triton`` is imported). On a GPU: the
compiled kernel against the torch backend at Qwen3-30B-A3B's shapes, inside a CUDA graph,
the engine with the fused backend against ``transformers``, and a timing.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from minisgl.core import Context, SamplingParams, set_global_ctx
from minisgl.distributed import set_tp_info
from minisgl.env import ENV
from minisgl.llm import LLM
from minisgl.models import ModelConfig, create_model, load_weight
from minisgl.models.moe_weight import shard_stacked_experts, stack_experts
from minisgl.moe import create_moe_backend, resolve_moe_backend
from minisgl.moe.routing import fused_topk, moe_align_block_size
from minisgl.moe.torch_backend import TorchMoe
from minisgl.utils import cached_load_hf_config, torch_dtype
from tests.helpers import DEVICE, MODELS, ensure_model, hf_greedy
from tests.helpers.interpreter import interpret

QWEN3_MOE = MODELS / "tiny-qwen3-moe"
PROMPTS = [
    "The capital of France is",
    "List three prime numbers:",
    "def fibonacci(n):",
    "1 + 1 =",
    "Once upon a time,",
]


@pytest.fixture(scope="module")
def moe_path():
    return ensure_model(QWEN3_MOE)


def assert_close(got: torch.Tensor, want: torch.Tensor, atol: float, what: str) -> None:
    """Shapes first, then the largest difference and where it is."""
    assert tuple(got.shape) == tuple(want.shape), (
        f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    )
    diff = (got.double() - want.double()).abs()
    worst = float(diff.max()) if diff.numel() else 0.0
    if worst > atol:
        idx = tuple(int(i) for i in (diff == diff.max()).nonzero()[0])
        raise AssertionError(
            f"{what}: max |diff| {worst:.3g} > {atol:.1g} at {idx}: "
            f"got {float(got[idx]):.6g}, expected {float(want[idx]):.6g}"
        )


def random_moe(
    seed: int, tokens: int, hidden: int, inter: int, experts: int, device="cpu", dtype=torch.float32
):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    w1 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    logits = torch.randn(tokens, experts, generator=gen)
    return [t.to(device=device, dtype=dtype) for t in (x, w1, w2, logits)]


# --------------------------------------------------------------------------- config and router


def test_config_reads_the_moe_fields(moe_path):
    c = ModelConfig.from_hf(cached_load_hf_config(str(moe_path)))
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (8, 2, 32)
    assert c.norm_topk_prob and c.is_moe and all(c.is_sparse_layer(i) for i in range(c.num_layers))
    from transformers import Qwen3MoeConfig

    # a hub config.json says num_experts; what transformers 5 writes says num_local_experts
    hub = ModelConfig.from_hf(
        Qwen3MoeConfig(num_experts=128, num_experts_per_tok=8, mlp_only_layers=[0])
    )
    assert hub.num_experts == 128 and not hub.is_sparse_layer(0) and hub.is_sparse_layer(1)
    dense = ModelConfig.from_hf(cached_load_hf_config(str(MODELS / "tiny-qwen3")))
    assert not dense.is_moe and not dense.is_sparse_layer(0)


def test_renormalised_top2_of_a_known_distribution():
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    w, ids = fused_topk(logits, 2, renormalize=False)
    assert ids.tolist() == [[3, 2]] and ids.dtype == torch.int32
    assert_close(w, torch.tensor([[0.4, 0.3]]), 1e-6, "raw top-2 probabilities")
    w, _ = fused_topk(logits, 2, renormalize=True)
    assert_close(w, torch.tensor([[4 / 7, 3 / 7]]), 1e-6, "renormalised top-2 weights")


@pytest.mark.parametrize("norm", [True, False])
def test_router_matches_transformers(norm):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    cfg = Qwen3MoeConfig(hidden_size=48, num_experts=16, num_experts_per_tok=4, norm_topk_prob=norm)
    router = Qwen3MoeTopKRouter(cfg)
    torch.nn.init.normal_(router.weight, generator=torch.Generator().manual_seed(0))
    x = torch.randn(33, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, want_w, want_ids = router(x)
    w, ids = fused_topk(F.linear(x, router.weight.detach()), 4, renormalize=norm)
    assert torch.equal(ids.long(), want_ids), "chosen experts differ from transformers'"
    assert torch.equal(w, want_w), (
        f"weights differ: max |diff| {float((w - want_w).abs().max()):.3g}"
    )


def test_router_rejects_bad_arguments():
    with pytest.raises(ValueError, match="topk must be in"):
        fused_topk(torch.zeros(2, 4), 5, True)
    with pytest.raises(ValueError, match=r"\[T, E\]"):
        fused_topk(torch.zeros(4), 1, True)


# --------------------------------------------------------------------------- alignment


def test_align_block_size_on_a_worked_example():
    # 4 tokens x 3 choices over 4 experts, 3 slots each: every expert pads 3 -> 4
    ids = torch.tensor([[1, 2, 3], [0, 1, 3], [0, 2, 3], [0, 1, 2]])
    sorted_ids, expert_ids, total = moe_align_block_size(ids, 4, 4)
    pad = ids.numel()
    assert sorted_ids.tolist()[:16] == [3, 6, 9, pad, 0, 4, 10, pad, 1, 7, 11, pad, 2, 5, 8, pad]
    assert sorted_ids.numel() == 12 + 4 * 3 and (sorted_ids[16:] == pad).all()
    assert expert_ids.tolist() == [0, 1, 2, 3, -1, -1] and total.tolist() == [16]


@pytest.mark.parametrize(
    "tokens,top_k,experts,block", [(1, 2, 8, 16), (37, 2, 8, 4), (50, 8, 64, 16), (5, 3, 16, 1)]
)
def test_align_block_size_invariants(tokens, top_k, experts, block):
    gen = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).int()
    sorted_ids, expert_ids, total = moe_align_block_size(ids, block, experts)
    n, used = ids.numel(), int(total)
    counts = torch.bincount(ids.flatten().long(), minlength=experts)
    assert used == int(((counts + block - 1) // block * block).sum()), "num_tokens_post_padded"
    assert sorted_ids.numel() == n + experts * (block - 1) and expert_ids.numel() == -(
        -sorted_ids.numel() // block
    )
    real = sorted_ids[sorted_ids < n]
    assert sorted(real.tolist()) == list(range(n)), "every slot must appear exactly once"
    assert (sorted_ids[used:] == n).all(), "past num_tokens_post_padded only padding"
    flat = ids.flatten()
    for b in range(expert_ids.numel()):
        rows = sorted_ids[b * block : (b + 1) * block]
        if b * block >= used:
            assert expert_ids[b] == -1, (
                f"block {b} is past the end but names expert {int(expert_ids[b])}"
            )
            continue
        slots = rows[rows < n].long()
        assert slots.numel() > 0, f"block {b} holds only padding"
        assert (flat[slots] == expert_ids[b]).all(), f"block {b} mixes experts"
        assert torch.equal(slots, slots.sort().values), f"block {b}: slots not in token order"
    assert torch.equal(expert_ids[: used // block], expert_ids[: used // block].sort().values)


# --------------------------------------------------------------------------- torch backend, loading


def test_torch_backend_matches_the_transformers_block():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    from minisgl.models.qwen3_moe import MoEMLP

    hf_cfg = Qwen3MoeConfig(
        hidden_size=32,
        moe_intermediate_size=24,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
    )
    block = Qwen3MoeSparseMoeBlock(hf_cfg).eval()
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    x = torch.randn(1, 19, 32, generator=gen)
    with torch.no_grad():
        want = block(x)[0]
    mlp = MoEMLP(ModelConfig.from_hf(hf_cfg))
    mlp.load_state_dict({k: v.detach().clone() for k, v in block.state_dict().items()})
    ctx = Context(page_size=1)
    ctx.moe_backend = TorchMoe()
    set_global_ctx(ctx)
    try:
        got = mlp.forward(x[0])
    finally:
        set_global_ctx(None)
    assert_close(got, want, 1e-6, "MoEMLP (torch backend) vs Qwen3MoeSparseMoeBlock")


def _checkpoint(path):
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_loader_stacks_experts_by_id(moe_path):
    ckpt = _checkpoint(moe_path)
    weights = dict(stack_experts(load_weight(moe_path, torch.device("cpu"), torch.float32), 8))
    layer = "model.layers.2.mlp"
    assert weights[f"{layer}.experts.gate_up_proj"].shape == (8, 64, 64)
    assert weights[f"{layer}.experts.down_proj"].shape == (8, 64, 32)
    for e in (0, 5, 7):
        src = f"{layer}.experts.{e}"
        gate_up = torch.cat([ckpt[f"{src}.gate_proj.weight"], ckpt[f"{src}.up_proj.weight"]])
        assert torch.equal(weights[f"{layer}.experts.gate_up_proj"][e], gate_up), (
            f"expert {e}'s gate|up"
        )
        assert torch.equal(
            weights[f"{layer}.experts.down_proj"][e], ckpt[f"{src}.down_proj.weight"]
        )
    assert torch.equal(weights[f"{layer}.gate.weight"], ckpt[f"{layer}.gate.weight"])
    assert not [n for n in weights if ".experts." in n and n.split(".experts.")[1][0].isdigit()]


def test_loader_rejects_missing_or_extra_experts():
    pairs = [
        (f"model.layers.0.mlp.experts.{e}.down_proj.weight", torch.zeros(4, 2)) for e in range(3)
    ]
    with pytest.raises(ValueError, match="experts missing"):
        list(stack_experts(iter(pairs), 4))
    with pytest.raises(ValueError, match="expert 2 but the config has 2"):
        list(stack_experts(iter(pairs), 2))


def test_stacked_and_per_expert_checkpoints_shard_alike(moe_path):
    """Rank r of 2 from the per-expert files == rank r's cut of the already stacked tensor."""
    full = dict(stack_experts(load_weight(moe_path, torch.device("cpu"), torch.float32), 8))
    try:
        for rank in (0, 1):
            set_tp_info(rank, 2)
            shard = dict(
                stack_experts(load_weight(moe_path, torch.device("cpu"), torch.float32), 8)
            )
            for proj, shape in (("gate_up_proj", (8, 32, 64)), ("down_proj", (8, 64, 16))):
                name = f"model.layers.1.mlp.experts.{proj}"
                assert shard[name].shape == shape, (
                    f"{name} on rank {rank}: {tuple(shard[name].shape)}"
                )
                assert torch.equal(shard[name], shard_stacked_experts(name, full[name], rank, 2)), (
                    name,
                    rank,
                )
            # the stacked layout is cut the same way when it comes straight from a file
            stacked = {
                "model.layers.1.mlp.experts.down_proj": full["model.layers.1.mlp.experts.down_proj"]
            }
            [(_, cut)] = list(stack_experts(iter(stacked.items()), 8))
            assert torch.equal(cut, shard["model.layers.1.mlp.experts.down_proj"])
    finally:
        set_tp_info(0, 1)


def test_dense_layers_keep_a_dense_mlp():
    from transformers import Qwen3MoeConfig

    cfg = ModelConfig.from_hf(
        Qwen3MoeConfig(
            hidden_size=32,
            intermediate_size=48,
            moe_intermediate_size=16,
            num_hidden_layers=3,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            num_experts=4,
            mlp_only_layers=[1],
            vocab_size=64,
        )
    )
    cfg = ModelConfig(**{**cfg.__dict__, "architectures": ["Qwen3MoeForCausalLM"]})
    with torch.device("meta"), torch_dtype(torch.float32):
        names = create_model(cfg).state_dict()
    assert names["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 32, 32)
    assert names["model.layers.1.mlp.gate_up_proj.weight"].shape == (96, 32)
    assert (
        "model.layers.1.mlp.gate.weight" not in names and "model.layers.2.mlp.gate.weight" in names
    )


def test_backend_choice():
    assert resolve_moe_backend("auto", torch.device("cpu")) == "torch"
    assert (
        resolve_moe_backend("auto", torch.device("cuda")) == "fused"
    )  # names only: triton is a dev dependency
    old = ENV.TORCH_KERNELS.value
    ENV.TORCH_KERNELS.value = True
    try:
        assert resolve_moe_backend("auto", torch.device("cuda")) == "torch"
    finally:
        ENV.TORCH_KERNELS.value = old
    assert resolve_moe_backend("fused", torch.device("cpu")) == "fused"
    with pytest.raises(ValueError, match="unknown MoE backend 'nope'; supported: fused, torch"):
        create_moe_backend("nope", torch.device("cpu"))


# --------------------------------------------------------------------------- end to end


def build_llm(path, **kwargs):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True
    options = dict(
        dtype=torch.float32,
        device=DEVICE,
        attention_backend="torch",
        max_running_req=8,
        num_page_override=1024,
        max_seq_len_override=512,
        cache_type="naive",
    )
    options.update(kwargs)
    return LLM(str(path), **options)


def test_tiny_qwen3_moe_equals_hf_greedy(moe_path):
    llm = build_llm(moe_path, moe_backend="torch")
    out = llm.generate(PROMPTS, SamplingParams(max_tokens=10, ignore_eos=True))
    ref = hf_greedy(moe_path, PROMPTS, 10)
    for prompt, o, r in zip(PROMPTS, out, ref):
        assert o["token_ids"] == r, f"{prompt!r}: engine {o['token_ids']} vs transformers {r}"


# --------------------------------------------------------------------------- Triton


def test_triton_kernel_matches_torch_in_the_interpreter():
    script = textwrap.dedent(
        """
        import torch
        from minisgl.moe.fused import fused_experts
        from minisgl.moe.routing import fused_topk
        from minisgl.moe.torch_backend import torch_experts
        from test_ch21_moe import assert_close, random_moe

        small = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16}
        cases = [  # tokens, hidden, inter, experts, top_k, config (None: the default for T)
            (1, 64, 32, 8, 2, None),     # decode: most of each block is padding
            (13, 40, 24, 8, 2, small),   # K not a multiple of BLOCK_SIZE_K, N of BLOCK_SIZE_N
            (20, 64, 32, 8, 2, None),    # prefill config: 64-row blocks
            (6, 32, 16, 16, 4, small),   # more experts than slots: many experts get nothing
        ]
        for i, (t, h, inter, e, k, cfg) in enumerate(cases):
            x, w1, w2, logits = random_moe(i, t, h, inter, e)
            tw, ti = fused_topk(logits, k, renormalize=i % 2 == 0)
            assert_close(fused_experts(x, w1, w2, tw, ti, cfg), torch_experts(x, w1, w2, tw, ti), 1e-5,
                         f"case {i}: T={t} H={h} I={inter} E={e} k={k}")
        print("interpreter ok")
        """
    )
    res = interpret(script, timeout=300)
    assert res.returncode == 0 and "interpreter ok" in res.stdout, res.stderr[-3000:]


# Qwen3-30B-A3B: hidden 2048, 128 experts of 768, top-8
A3B = dict(hidden=2048, inter=768, experts=128, top_k=8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,atol", [(torch.bfloat16, 3e-2), (torch.float32, 1e-4)])
@pytest.mark.parametrize("tokens", [1, 7, 256, 2048])
def test_fused_matches_torch_on_gpu(tokens, dtype, atol):
    from minisgl.moe.fused import fused_experts
    from minisgl.moe.torch_backend import torch_experts

    x, w1, w2, logits = random_moe(
        tokens, tokens, A3B["hidden"], A3B["inter"], A3B["experts"], "cuda", dtype
    )
    tw, ti = fused_topk(logits, A3B["top_k"], True)
    want = torch_experts(x, w1, w2, tw, ti).float()
    got = fused_experts(x, w1, w2, tw, ti).float()
    scale = float(want.abs().max())
    assert_close(
        got / scale,
        want / scale,
        atol,
        f"{tokens} tokens, {dtype} (relative to max |y| {scale:.3g})",
    )


@pytest.mark.gpu
def test_fused_moe_replays_in_a_cuda_graph():
    from minisgl.moe.fused import FusedMoe

    x, w1, w2, logits = random_moe(0, 16, 256, 128, 32, "cuda", torch.bfloat16)
    backend = FusedMoe()
    backend.forward(x, w1, w2, logits, 4, True)  # compile outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = backend.forward(x, w1, w2, logits, 4, True)
    torch.cuda.current_stream().wait_stream(stream)
    for seed in (1, 2):  # new inputs, new routing: the captured kernels must follow
        x2, _, _, logits2 = random_moe(seed, 16, 256, 128, 32, "cuda", torch.bfloat16)
        x.copy_(x2)
        logits.copy_(logits2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, backend.forward(x, w1, w2, logits, 4, True)), (
            f"replay {seed} differs from eager"
        )


@pytest.mark.gpu
def test_engine_with_the_fused_backend_equals_hf_greedy(moe_path):
    llm = build_llm(moe_path, device="cuda", moe_backend="auto")  # auto: fused on CUDA
    assert type(llm.engine.ctx.moe_backend).__name__ == "FusedMoe"
    out = llm.generate(PROMPTS, SamplingParams(max_tokens=10, ignore_eos=True))
    ref = hf_greedy(moe_path, PROMPTS, 10)
    for prompt, o, r in zip(PROMPTS, out, ref):
        assert o["token_ids"] == r, f"{prompt!r}: engine {o['token_ids']} vs transformers {r}"


@pytest.mark.gpu
def test_fused_is_timed_against_torch(capsys):
    """Not a race (timings vary): prints both; fails only if the fused path is slower than the loop."""
    from minisgl.benchmark.moe_layer import time_moe_layer

    row = time_moe_layer(256, **A3B, dtype=torch.bfloat16, iters=20)
    with capsys.disabled():
        print(
            f"\n256 tokens, Qwen3-30B-A3B MoE layer: torch {row['torch_ms']:.3f} ms, fused {row['fused_ms']:.3f} ms"
        )
    assert row["fused_ms"] < row["torch_ms"], row
