"""Chapter 0: a whole LLM inference engine in one file, before we build the real one.

    python -m tools.models smollm2          # once: converts SmolLM2-135M-Instruct to models/
    python examples/ch00_tiny_engine.py     # greedy text for 3 prompts, checked against HF

This is SmolLM2-135M-Instruct (the Llama architecture) written out by hand with nothing
but torch: safetensors weights loaded into a dict, RMSNorm, rotary embeddings, grouped-query
attention over a per-request KV cache, a SwiGLU MLP and an LM head tied to the embedding.
Generation is the two phases every serving engine has: *prefill* runs the whole prompt at
once and fills the cache, then *decode* feeds back one token at a time, reading the cache
instead of recomputing the past. Each request owns one contiguous cache tensor sized for
its longest possible length, the simple scheme that the book's paged KV cache replaces.
"""

# output: mask decode \d+\.\d ms

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "models" / "SmolLM2-135M-Instruct"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "The three primary colors are"]


class TinyEngine:
    """Greedy generation for a Llama-architecture checkpoint, one request at a time."""

    def __init__(self, model_dir: Path, max_seq_len: int = 512) -> None:
        cfg = json.loads((model_dir / "config.json").read_text())
        self.num_layers: int = cfg["num_hidden_layers"]
        self.num_q_heads: int = cfg["num_attention_heads"]
        self.num_kv_heads: int = cfg["num_key_value_heads"]
        self.head_dim: int = cfg.get("head_dim") or cfg["hidden_size"] // self.num_q_heads
        self.eps: float = cfg["rms_norm_eps"]
        self.max_seq_len = max_seq_len
        self.w: Dict[str, torch.Tensor] = {
            k: v.float() for k, v in load_file(model_dir / "model.safetensors").items()
        }
        # Tied embeddings: the checkpoint stores one matrix for both ends of the model.
        self.lm_head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)

        # RoPE angles for every position are computed once; a step only gathers its rows.
        theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]
        inv_freq = 1.0 / theta ** (
            torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim
        )
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)  # [S, D/2]
        self.cos, self.sin = angles.cos(), angles.sin()

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # Scale each token's vector to unit RMS, then by a learned per-channel gain.
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Rotate channel pairs (i, i + D/2) of x: [T, H, D] by angles of positions pos: [T]."""
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]  # [T, 1, D/2]
        x1, x2 = x.chunk(2, dim=-1)  # HF Llama pairs the halves, not neighbours
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def new_cache(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """One request's KV cache: k and v, each [L, S_max, H_kv, D]."""
        shape = (self.num_layers, self.max_seq_len, self.num_kv_heads, self.head_dim)
        return torch.zeros(shape), torch.zeros(shape)

    def attention(self, i: int, x: torch.Tensor, pos: torch.Tensor, cache) -> torch.Tensor:
        p = f"model.layers.{i}.self_attn."
        T = x.shape[0]
        q = (x @ self.w[p + "q_proj.weight"].T).view(T, self.num_q_heads, self.head_dim)
        k = (x @ self.w[p + "k_proj.weight"].T).view(T, self.num_kv_heads, self.head_dim)
        v = (x @ self.w[p + "v_proj.weight"].T).view(T, self.num_kv_heads, self.head_dim)
        q, k = self.rope(q, pos), self.rope(k, pos)
        # Store this step's keys/values, then attend over everything cached so far: in
        # decode that is the whole past, computed once instead of once per new token.
        k_cache, v_cache = cache
        k_cache[i, pos], v_cache[i, pos] = k, v
        end = int(pos[-1]) + 1
        keys, values = k_cache[i, :end], v_cache[i, :end]  # [S, H_kv, D]
        # GQA: each group of H_q / H_kv query heads shares one KV head.
        group = self.num_q_heads // self.num_kv_heads
        keys = keys.repeat_interleave(group, dim=1)
        values = values.repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,shd->hts", q, keys) / self.head_dim**0.5  # [H_q, T, S]
        # Causal mask: a token sees only positions up to its own.
        future = torch.arange(end)[None, :] > pos[:, None]  # [T, S]
        scores = scores.masked_fill(future, float("-inf"))
        out = torch.einsum("hts,shd->thd", scores.softmax(dim=-1), values).reshape(T, -1)
        return out @ self.w[p + "o_proj.weight"].T

    def mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        p = f"model.layers.{i}.mlp."
        gate = torch.nn.functional.silu(x @ self.w[p + "gate_proj.weight"].T)
        return (gate * (x @ self.w[p + "up_proj.weight"].T)) @ self.w[p + "down_proj.weight"].T

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, pos: torch.Tensor, cache) -> torch.Tensor:
        """ids, pos: [T] -> logits of the last token: [V]. Writes T entries into cache."""
        h = self.w["model.embed_tokens.weight"][ids]  # [T, hidden]
        for i in range(self.num_layers):
            # Pre-norm residual blocks: each sub-layer adds its output to the stream.
            h = h + self.attention(
                i, self.rms_norm(h, self.w[f"model.layers.{i}.input_layernorm.weight"]), pos, cache
            )
            h = h + self.mlp(
                i, self.rms_norm(h, self.w[f"model.layers.{i}.post_attention_layernorm.weight"])
            )
        # Only the last position predicts the next token; skip the LM head for the rest.
        return self.rms_norm(h[-1], self.w["model.norm.weight"]) @ self.lm_head.T

    def generate(self, prompt_ids: List[int], max_new_tokens: int) -> Tuple[List[int], float]:
        """Greedy continuation: (new token ids, mean decode seconds per token)."""
        if len(prompt_ids) + max_new_tokens > self.max_seq_len:
            raise ValueError(f"prompt + output exceeds max_seq_len={self.max_seq_len}")
        cache = self.new_cache()
        # Prefill: the whole prompt in one forward pass.
        logits = self.forward(torch.tensor(prompt_ids), torch.arange(len(prompt_ids)), cache)
        out = [int(logits.argmax())]
        start = time.perf_counter()
        # Decode: one token per step, at the next position.
        for _ in range(max_new_tokens - 1):
            pos = len(prompt_ids) + len(out) - 1
            logits = self.forward(torch.tensor([out[-1]]), torch.tensor([pos]), cache)
            out.append(int(logits.argmax()))
        return out, (time.perf_counter() - start) / max(1, max_new_tokens - 1)


@functools.lru_cache(maxsize=1)
def _hf_model(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_greedy(model_dir: Path, prompt_ids: List[int], max_new_tokens: int) -> List[int]:
    """The reference: transformers' own greedy generation, in float32."""
    model = _hf_model(model_dir)
    ids = torch.tensor([prompt_ids])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
    )
    return out[0, len(prompt_ids) :].tolist()


def main() -> int:
    parser = argparse.ArgumentParser(description="Chapter 0: a tiny greedy engine for SmolLM2.")
    parser.add_argument(
        "--model", type=Path, default=Path(os.environ.get("MINISGL_MODEL", DEFAULT_MODEL))
    )
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument(
        "--no-check", action="store_true", help="skip the comparison with transformers"
    )
    args = parser.parse_args()
    if not (args.model / "model.safetensors").is_file():
        print(
            f"No model at {args.model}. Make it once with:  python -m tools.models smollm2",
            file=sys.stderr,
        )
        return 1

    torch.manual_seed(0)
    engine = TinyEngine(args.model)
    for prompt in PROMPTS:
        ids = engine.tokenizer(prompt).input_ids
        new, sec_per_token = engine.generate(ids, args.max_new_tokens)
        print(f"{prompt!r} -> {engine.tokenizer.decode(new)!r}")
        line = f"  {len(new)} tokens, decode {sec_per_token * 1e3:.1f} ms/token"
        if not args.no_check:
            line += f", matches HF: {new == hf_greedy(args.model, ids, args.max_new_tokens)}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
