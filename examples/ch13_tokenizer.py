"""Chapter 13: the tokenizer worker's two jobs, tokenize and (incrementally) detokenize.

A chat request is rendered with the model's chat template before it is tokenized. Then a
reply full of emoji and CJK is streamed back one token at a time: decoding each token on
its own shows the U+FFFD ("\ufffd") pieces a naive streamer would send, while the
DetokenizeManager holds them back until the character is complete, and its chunks add up
to exactly the full decode.

    python examples/ch13_tokenizer.py [--model PATH] [--tokenizer PATH]
"""
# capture-output

import argparse
import os

from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.message import DetokenizeMsg, TokenizeMsg
from minisgl.tokenizer import DetokenizeManager, TokenizeManager
from minisgl.utils import load_tokenizer

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument(
    "--tokenizer", default="models/qwen3-tokenizer", help="a second tokenizer to stream with"
)
args = parser.parse_args()

tokenizer = load_tokenizer(args.model)
chat = [{"role": "user", "content": "Say hello in Japanese."}]
[ids] = TokenizeManager(tokenizer).tokenize(
    [TokenizeMsg(uid=0, text=chat, sampling_params=SamplingParams())]
)
print(f"chat request -> {len(ids)} prompt tokens; the template renders it as:")
print("    " + repr(tokenizer.decode(ids.tolist())))

reply = "こんにちは 👋🏽! 中文也可以 🎉"
for path in (args.model, args.tokenizer):
    tok = AutoTokenizer.from_pretrained(path)  # the Qwen3 one is a tokenizer alone, no model
    out_ids = tok.encode(reply, add_special_tokens=False)
    manager = DetokenizeManager(tok, eos_token_ids=frozenset())
    manager.add(uid=0, num_prompt_tokens=len(ids), ignore_eos=False)
    print(f"\n{os.path.basename(path)}: {len(out_ids)} tokens")
    print(f"  {'token':>7}  {'decoded alone':<16} streamed chunk")
    chunks = []
    for k, token in enumerate(out_ids):
        [delta] = manager.detokenize(
            [DetokenizeMsg(uid=0, next_token=token, finished=k == len(out_ids) - 1)]
        )
        chunks.append(delta.text)
        print(f"  {token:>7}  {tok.decode([token])!r:<16} {delta.text!r}")
    naive = "".join(tok.decode([t]) for t in out_ids)
    print(f"  naive per-token text: {naive!r}")
    print(
        f"  streamed chunks join to the full decode: {''.join(chunks) == tok.decode(out_ids) == reply}; "
        f"any U+FFFD sent: {any(chr(0xFFFD) in c for c in chunks)}"
    )
