# The cells of chapter 13's notebook that run each part on the real tokenizer worker's
# managers (tools/notebook_parts.py puts each after the section its `part` names).

# %% part="The way in: prompts and chat templates"
# A chat request is rendered with the model's chat template, then tokenized.
from minisgl.core import SamplingParams
from minisgl.message import DetokenizeMsg, TokenizeMsg
from minisgl.tokenizer import DetokenizeManager, TokenizeManager
from minisgl.utils import load_tokenizer

tokenizer = load_tokenizer("models/SmolLM2-135M-Instruct")
chat = [{"role": "user", "content": "Say hello in Japanese."}]
[ids] = TokenizeManager(tokenizer).tokenize(
    [TokenizeMsg(uid=0, text=chat, sampling_params=SamplingParams())]
)
print(len(ids), "prompt tokens:", repr(tokenizer.decode(ids.tolist())))

# %% part="The way out: why per-token decoding breaks"
# One emoji is several byte-level tokens; decoded one by one, each piece is U+FFFD.
reply_ids = tokenizer.encode("hello 👋🏽", add_special_tokens=False)
print([tokenizer.decode([t]) for t in reply_ids])
print("together:", repr(tokenizer.decode(reply_ids)))

# %% part="The window: `prefix_offset` and `read_offset`"
# The manager sends nothing while the window ends in an incomplete character, then the
# whole character at once; its offsets move only when text goes out.
manager = DetokenizeManager(tokenizer, eos_token_ids=frozenset())
manager.add(uid=0, num_prompt_tokens=len(ids), ignore_eos=False)
for k, token in enumerate(reply_ids[:-1]):
    [delta] = manager.detokenize([DetokenizeMsg(uid=0, next_token=token, finished=False)])
    s = manager.status[0]
    print(f"token {token:>6}: sent {delta.text!r:<10} offsets {s.prefix_offset}, {s.read_offset}")

# %% part="The last token: flush, EOS and `finish_reason`"
# The last message flushes whatever is still held back and says why the request ended.
[delta] = manager.detokenize([DetokenizeMsg(uid=0, next_token=reply_ids[-1], finished=True)])
print(repr(delta.text), delta.finish_reason, "output tokens:", delta.num_output_tokens)
print("forgotten once finished:", 0 not in manager.status)

# %% part="Several steps at once, aborts, and unknown requests"
# Two steps of two requests in one drain, plus a message for a request nobody knows.
manager.add(uid=1, num_prompt_tokens=3, ignore_eos=False)
manager.add(uid=2, num_prompt_tokens=3, ignore_eos=False)
a, b = tokenizer.encode(" one two", add_special_tokens=False)[:2]
msgs = [
    DetokenizeMsg(uid=1, next_token=a, finished=False),
    DetokenizeMsg(uid=2, next_token=b, finished=False),
    DetokenizeMsg(uid=9, next_token=a, finished=False),  # unknown: skipped
    DetokenizeMsg(uid=1, next_token=b, finished=True),
]
print([(d.uid, d.text, d.finished) for d in manager.detokenize(msgs)])
