"""The tokenizer worker: prompts to ids on the way in, ids to text on the way out.

Mirrors upstream ``minisgl.tokenizer`` (explained in chapter 13).
"""

from .detokenize import DetokenizeManager
from .server import TokenizerWorker
from .tokenize import TokenizeManager

__all__ = ["DetokenizeManager", "TokenizeManager", "TokenizerWorker"]
