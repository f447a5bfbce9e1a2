"""Chapter 3: configs, weight loading and one forward pass against Hugging Face."""

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from minisgl.core import Batch, Context, Req, SamplingParams, set_global_ctx
from minisgl.models import ModelConfig, create_model, load_weight
from minisgl.utils import cached_load_hf_config, check_model_path, torch_dtype
from tests.helpers import hf_model


class _Meta:
    def __init__(self, n):
        self.n = n

    def get_last_indices(self, bs):
        return torch.tensor([self.n - 1])


class PromptOnlyAttention:
    """Causal attention over one prompt, no cache: enough for a single forward pass."""

    def forward(self, q, k, v, layer_id, batch):
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
        )
        return o.transpose(0, 1)


def build(path):
    config = ModelConfig.from_hf(cached_load_hf_config(str(path)))
    with torch.device("meta"), torch_dtype(torch.float32):
        model = create_model(config)
    model.load_state_dict(dict(load_weight(path, torch.device("cpu"), torch.float32)))
    return config, model


def last_logits(model, ids):
    ctx = Context()
    ctx.attn_backend = PromptOnlyAttention()
    set_global_ctx(ctx)
    batch = Batch([Req(ids, 0, 0, 1, 0, SamplingParams())], phase="prefill")
    batch.input_ids, batch.positions = ids, torch.arange(len(ids))
    batch.attn_metadata = _Meta(len(ids))
    try:
        with torch.inference_mode(), ctx.forward_batch(batch):
            return model.forward()[0]
    finally:
        set_global_ctx(None)


def test_smollm2_config(smollm2_path):
    c = ModelConfig.from_hf(cached_load_hf_config(str(smollm2_path)))
    assert (c.num_layers, c.hidden_size, c.num_qo_heads, c.num_kv_heads, c.head_dim) == (
        30,
        576,
        9,
        3,
        64,
    )
    assert c.tie_word_embeddings and c.vocab_size == 49152 and not c.attention_bias


def test_qwen_configs(qwen3_path, qwen2_path):
    q3 = ModelConfig.from_hf(cached_load_hf_config(str(qwen3_path)))
    q2 = ModelConfig.from_hf(cached_load_hf_config(str(qwen2_path)))
    assert q3.architectures == ["Qwen3ForCausalLM"] and not q3.attention_bias
    assert q2.architectures == ["Qwen2ForCausalLM"] and q2.attention_bias


def test_loader_merges_qkv_in_order(qwen2_path):
    _, model = build(qwen2_path)
    file = next(qwen2_path.glob("*.safetensors"))
    with safe_open(str(file), "pt") as f:
        parts = [
            f.get_tensor(f"model.layers.0.self_attn.{p}_proj.{w}")
            for w in ("weight", "bias")
            for p in "qkv"
        ]
    attn = model.model.layers[0].self_attn.qkv_proj
    assert torch.equal(attn.weight, torch.cat(parts[:3]))
    assert torch.equal(attn.bias, torch.cat(parts[3:]))


def test_tied_head_shares_the_embedding(smollm2_path):
    _, model = build(smollm2_path)
    assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize("which", ["smollm2", "qwen3", "qwen2"])
def test_one_forward_pass_matches_hf(which, request):
    path = request.getfixturevalue(f"{which}_path")
    _, model = build(path)
    ids = torch.tensor([785, 6722, 315, 9625, 374, 12095, 13], dtype=torch.int32)
    ours = last_logits(model, ids)
    with torch.inference_mode():
        ref = hf_model(path)(ids[None].long()).logits[0, -1]
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    assert int(ours.argmax()) == int(ref.argmax())


def test_unknown_architecture_is_named():
    config = ModelConfig(1, 1, 1, 1, 1, 1, 1, "silu", 1e-6, False, False, None, ["GPT2LMHeadModel"])
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        create_model(config)


def test_missing_model_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="tools.models smollm2"):
        check_model_path(tmp_path / "nothing-here")
