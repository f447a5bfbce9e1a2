"""The decode step of a few requests: each layer in four GEMV kernels and the attention, the
final norm inside the LM head.

At decode batch 1 a step is about fifteen kernels per layer, and each costs a few
microseconds however little it does, so the step's time is the kernel count, not the bytes.
This path walks the same model's layers and calls the fused kernel ops on their weights:

* ``norm_linear``: the layer's input norm and ``qkv_proj`` in one kernel (the norm is the
  GEMV's prologue); later the post-attention norm, ``gate_up_proj`` and SwiGLU in one;
* the attention from the raw ``qkv``: on a batch the split-KV backend took (its metadata's
  ``path``), one launch does the q/k norms, RoPE, the KV store and the attention
  (``SplitKVBackend.forward_qkv``); on any other the layer's own ``AttentionLayer.forward``;
* ``linear_add_residual_``: ``o_proj`` and ``down_proj`` each add their output into the
  residual stream in place, so the separate add-and-norm kernels disappear;
* ``norm_lm_head``: the final norm and the LM head in one persistent kernel.

The dataflow carries the residual stream alone (``residual: [B, hidden]``, updated in
place), where the unfused layers carry ``(x, residual)`` and fuse each add into the next
norm. ``FusedDecodeLM`` wraps a model the way ``torch.compile`` does: decode batches of at
most ``FUSED_DECODE_MAX_BS`` requests run here, every other batch and every attribute are
the model's own. It needs one rank (each layer's whole output is added into the residual)
and dense MLPs. The engine wraps its model where the fused kernels run in Triton; the
speed-up ``fused_decode`` off (``MINISGL_DISABLE_FUSED_DECODE=1``) keeps the unfused path at
every batch size. Upstream mini-sglang has no fused decode path; this module is the book's
own.
"""

from __future__ import annotations

from typing import Any

import torch

from minisgl.attention.split_kv import QKNormRope, SplitKVBackend, SplitKVMetadata
from minisgl.core import Batch, get_global_ctx
from minisgl.distributed import get_tp_info
from minisgl.kernel import HALF, speedups
from minisgl.kernel.fused_ops import linear_add_residual_, norm_linear, norm_lm_head
from minisgl.kernel.speedups import FUSED_DECODE_MAX_BS

from .base import BaseLLMModel
from .utils import CausalLM, DecoderLayer, GatedMLP, RopeAttn


def fusable(model: BaseLLMModel) -> bool:
    """Whether ``model`` can take the fused path: a ``CausalLM`` of dense MLPs, on one rank."""
    return (
        isinstance(model, CausalLM)
        and get_tp_info().size == 1
        and all(isinstance(layer.mlp, GatedMLP) for layer in model.model.layers)
    )


def takes(model: CausalLM, batch: Batch) -> bool:
    """Whether ``batch`` runs on the fused path: a decode of at most ``FUSED_DECODE_MAX_BS``
    requests, an fp16/bf16 model, and the speed-up ``fused_decode`` on."""
    return (
        batch.is_decode
        and batch.padded_size <= FUSED_DECODE_MAX_BS
        and model.model.embed_tokens.weight.dtype in HALF
        and speedups.current().fused_decode
    )


# >>> ch20
def takes_large(model: CausalLM, batch: Batch) -> bool:
    """Whether ``batch`` runs the model's own layers with the attention from ``qkv``: a decode
    that the split-KV backend sends to its batch kernel, an fp16/bf16 model, and the
    speed-up ``fused_decode`` on."""
    meta = batch.attn_metadata
    return (
        isinstance(meta, SplitKVMetadata)
        and meta.path == "batch"
        and model.model.embed_tokens.weight.dtype in HALF
        and speedups.current().fused_decode
    )


# <<< ch20


def _attention(attn: RopeAttn, qkv: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``qkv: [B, (H_q + 2 H_kv) D]`` -> the attention output ``[B, H_q D]``."""
    backend = get_global_ctx().attn_backend
    if not isinstance(batch.attn_metadata, SplitKVMetadata):  # the backend took no path
        return attn.attn.forward(qkv)
    assert isinstance(backend, SplitKVBackend)
    has_norm = attn.q_norm is not None and attn.k_norm is not None
    rope = QKNormRope(
        attn.attn.rotary.cos_sin_cache(qkv.device),
        attn.q_norm.weight if has_norm else None,
        attn.k_norm.weight if has_norm else None,
        attn.q_norm.eps if has_norm else 0.0,
    )
    o = backend.forward_qkv(qkv, rope, attn.attn.layer_id, batch)
    return o.reshape(qkv.shape[0], -1)


def forward_layer(layer: DecoderLayer, residual: torch.Tensor, batch: Batch) -> None:
    """One decoder layer on the residual stream ``residual: [B, hidden]``, in place."""
    attn, mlp = layer.self_attn, layer.mlp
    norm = layer.input_layernorm
    qkv = norm_linear(residual, norm.weight, norm.eps, attn.qkv_proj.weight, attn.qkv_proj.bias)
    linear_add_residual_(
        _attention(attn, qkv, batch), attn.o_proj.weight, residual, attn.o_proj.bias
    )
    norm = layer.post_attention_layernorm
    act = norm_linear(residual, norm.weight, norm.eps, mlp.gate_up_proj.weight, swiglu=True)
    linear_add_residual_(act, mlp.down_proj.weight, residual)


def forward(model: CausalLM, batch: Batch) -> torch.Tensor:
    """The whole decode step on the fused path -> logits ``[B, V]``."""
    residual = model.model.embed_tokens.forward(batch.input_ids)  # a new tensor: ours to update
    for layer in model.model.layers:
        forward_layer(layer, residual, batch)
    norm = model.model.norm
    return norm_lm_head(residual, norm.weight, norm.eps, model.lm_head.weight)


# >>> ch20
def forward_large(model: CausalLM, batch: Batch) -> torch.Tensor:
    """A large decode step -> logits ``[B, V]``: the unfused layers (``DecoderLayer.forward``),
    except that each attention starts from the raw ``qkv``. Products this wide are cuBLAS's,
    and the norms stay fused with the residual adds; the q/k work and the store move into the
    batch kernel."""
    x, residual = model.model.embed_tokens.forward(batch.input_ids), None
    for layer in model.model.layers:
        x, residual = layer.input_layernorm.forward(x, residual)
        attn = layer.self_attn
        x = attn.o_proj.forward(_attention(attn, attn.qkv_proj.forward(x), batch))
        x, residual = layer.post_attention_layernorm.forward(x, residual)
        x = layer.mlp.forward(x)
    return model.lm_head.forward(model.model.norm.forward(x, residual)[0])


# <<< ch20


class FusedDecodeLM(BaseLLMModel):
    """``model`` with its decode steps of a few requests on the fused path.

    ``forward()`` reads the batch from the global context like any model; the weights, their
    loading and every other attribute are ``model``'s (``engine.model.model.layers`` reaches
    the wrapped model's layers).

    Raises:
        ValueError: for a model that is not ``fusable``.
    """

    def __init__(self, model: BaseLLMModel) -> None:
        if not fusable(model):
            raise ValueError(f"{type(model).__name__} cannot take the fused decode path")
        self._model: CausalLM = model  # type: ignore[assignment]
        self.tie_word_embeddings = model.tie_word_embeddings

    @property
    def unfused(self) -> CausalLM:
        """The wrapped model itself, whose ``forward`` never takes the fused path."""
        return self._model

    def forward(self) -> torch.Tensor:
        batch = get_global_ctx().batch
        if takes(self._model, batch):
            return forward(self._model, batch)
        # >>> ch20: the large ones with the attention from qkv
        if takes_large(self._model, batch):
            return forward_large(self._model, batch)
        # <<< ch20
        return self._model.forward()

    def state_dict(self, **kwargs: Any) -> Any:
        return self._model.state_dict(**kwargs)

    def load_state_dict(self, state_dict: Any, **kwargs: Any) -> None:
        self._model.load_state_dict(state_dict, **kwargs)

    def __getattr__(self, name: str) -> Any:  # only for what the wrapper does not define itself
        if name == "_model":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self._model, name)
