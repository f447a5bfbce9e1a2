"""Utilities shared by every part of the engine (no engine logic lives here)."""

# >>> ch03
from .hf import cached_load_hf_config, check_model_path, load_eos_token_ids, load_tokenizer

# <<< ch03
from .logger import init_logger
from .misc import align_up, div_ceil, div_even
from .registry import Registry
from .torch_utils import torch_dtype

__all__ = [
    "Registry",
    "align_up",
    "cached_load_hf_config",  # +ch03
    "check_model_path",  # +ch03
    "div_ceil",
    "div_even",
    "init_logger",
    "load_eos_token_ids",  # +ch03
    "load_tokenizer",  # +ch03
    "torch_dtype",
]
