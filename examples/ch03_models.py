"""Chapter 3: SmolLM2 built from the book's blocks, checked against Hugging Face.

The weights are streamed from safetensors, q/k/v and gate/up merged on the way in; then
one prompt runs through the model. There is no KV cache yet and no attention backend: a
ten-line stand-in attends over the prompt alone, which is all a single forward pass over
one prompt needs.
"""

# output: mask = \d\.\de[-+]\d+;

import argparse
import os

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import Batch, Context, Req, SamplingParams, set_global_ctx
from minisgl.models import ModelConfig, create_model, load_weight
from minisgl.utils import cached_load_hf_config, check_model_path, torch_dtype

parser = argparse.ArgumentParser()
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
path = str(check_model_path(parser.parse_args().model))


class PromptOnlyAttention:
    """Causal attention over the tokens of one prompt: no cache, no paging."""

    class Meta:
        def __init__(self, num_tokens: int) -> None:
            self.num_tokens = num_tokens

        def get_last_indices(self, bs: int) -> torch.Tensor:
            return torch.tensor([self.num_tokens - 1])

    def forward(self, q, k, v, layer_id, batch):  # q: [T, H_q, D], k/v: [T, H_kv, D]
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
        )
        return o.transpose(0, 1)


config = ModelConfig.from_hf(cached_load_hf_config(path))
print(
    f"{config.architectures[0]}: {config.num_layers} layers, hidden {config.hidden_size}, "
    f"{config.num_qo_heads} query heads sharing {config.num_kv_heads} KV heads of dim {config.head_dim}, "
    f"vocab {config.vocab_size}, tied embeddings: {config.tie_word_embeddings}"
)

with torch.device("meta"), torch_dtype(torch.float32):
    model = create_model(config)  # shapes only: no memory yet
weights = dict(load_weight(path, torch.device("cpu"), torch.float32))
for name in ["model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.mlp.gate_up_proj.weight"]:
    print(f"  merged on load: {name} {tuple(weights[name].shape)}")
model.load_state_dict(weights)
num_params = sum(t.numel() for t in model.state_dict().values()) - (
    model.lm_head.weight.numel() if config.tie_word_embeddings else 0
)
print(f"  {num_params / 1e6:.1f} M parameters loaded")

tokenizer = AutoTokenizer.from_pretrained(path)
prompt = "The capital of France is"
ids = torch.tensor(tokenizer.encode(prompt), dtype=torch.int32)
ctx = Context()
ctx.attn_backend = PromptOnlyAttention()  # type: ignore[assignment]
set_global_ctx(ctx)
batch = Batch([Req(ids, 0, 0, 1, 0, SamplingParams())], phase="prefill")
batch.input_ids, batch.positions = ids, torch.arange(len(ids))
batch.attn_metadata = PromptOnlyAttention.Meta(len(ids))
with torch.inference_mode(), ctx.forward_batch(batch):
    logits = model.forward()[0]

hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
with torch.inference_mode():
    hf_logits = hf(ids[None].long()).logits[0, -1]
top = logits.topk(3).indices.tolist()
print(f"next token after {prompt!r}: " + ", ".join(repr(tokenizer.decode([t])) for t in top))
print(
    f"max |logits - HF logits| = {float((logits - hf_logits).abs().max()):.1e}; "
    f"same argmax as HF: {int(logits.argmax()) == int(hf_logits.argmax())}"
)
