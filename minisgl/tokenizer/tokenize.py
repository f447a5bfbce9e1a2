"""Text (or chat messages) to token ids. Mirrors upstream ``minisgl.tokenizer.tokenize``."""

from __future__ import annotations

from typing import List

import torch
from transformers import PreTrainedTokenizerBase

from minisgl.message import TokenizeMsg


class TokenizeManager:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def prompt_text(self, msg: TokenizeMsg) -> str:
        """The prompt as text: ``msg.text`` itself, or for chat messages the model's chat
        template rendered with the assistant's turn opened (``add_generation_prompt``).

        Raises:
            ValueError: for chat messages when the tokenizer has no chat template.
        """
        if isinstance(msg.text, str):
            return msg.text
        if not self.tokenizer.chat_template:
            raise ValueError("this model's tokenizer has no chat template: send a prompt instead")
        prompt = self.tokenizer.apply_chat_template(
            msg.text, tokenize=False, add_generation_prompt=True
        )
        assert isinstance(prompt, str)
        return prompt

    def tokenize(self, msgs: List[TokenizeMsg]) -> List[torch.Tensor]:
        """One ``[N_i]`` int32 CPU tensor of prompt ids per message.

        A plain prompt is encoded as the offline ``LLM`` encodes it (with the tokenizer's
        special tokens, if it adds any), so both give the same ids. A rendered chat
        template already holds every special token it needs: nothing more is added.
        """
        out: List[torch.Tensor] = []
        for msg in msgs:
            chat = not isinstance(msg.text, str)
            ids = self.tokenizer.encode(self.prompt_text(msg), add_special_tokens=not chat)
            out.append(torch.tensor(ids, dtype=torch.int32))
        return out

    # >>> ch15
    def min_tokens_per_message(self) -> int:
        """The fewest tokens the chat template spends on one more message with empty
        content, measured on turns of the user and the assistant: the API server bounds a
        chat's message count by the context with it, before tokenizing anything. 0 (no
        bound) without a template, or for one that refuses the probe's empty turns."""
        if not self.tokenizer.chat_template:
            return 0

        def count(n: int) -> int:
            chat = [{"role": ("user", "assistant")[i % 2], "content": ""} for i in range(n)]
            text = self.tokenizer.apply_chat_template(chat, tokenize=False)
            return len(self.tokenizer.encode(text, add_special_tokens=False))

        try:
            return max(0, min(count(2) - count(1), count(3) - count(2)))
        except Exception:  # a template's own rule (say, no empty turns): no bound from it
            return 0

    # <<< ch15
