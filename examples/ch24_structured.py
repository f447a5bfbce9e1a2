"""Chapter 24: structured output. SmolLM2 answers four requests for a user record, held to a
JSON schema, then the same prompts unconstrained for contrast; every answer is parsed and
validated. Then one request's first steps, token by token: how many of the 49,152 tokens its
grammar allows at each step, and which token the model picked.

    python examples/ch24_structured.py [--model PATH] [--device cpu|cuda] [--trace FILE]
"""

# output: trace

import argparse
import json
import os

import jsonschema
import torch

from minisgl.core import SamplingParams
from minisgl.llm import LLM

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cpu", help="cpu or cuda")
parser.add_argument("--trace", metavar="FILE", help="record the constrained run's steps (JSON)")
args = parser.parse_args()

USER = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "editor", "guest"]},
        "email": {"type": "string", "pattern": "^[a-z]{1,10}@example\\.com$"},
    },
    "required": ["name", "age", "role", "email"],
    "additionalProperties": False,
}
PROMPTS = [
    "Write the user record of the site's administrator as JSON.",
    "A new guest signed up. Their user record:",
    "Give me a JSON object for an editor called Ada.",
    "User record:",
]


def validity(text: str) -> str:
    try:
        jsonschema.validate(json.loads(text), USER)
    except json.JSONDecodeError as e:
        return f"not JSON ({e.msg})"
    except jsonschema.ValidationError as e:
        return f"invalid: {e.message}"
    return "valid"


llm = LLM(args.model, dtype=torch.float32, device=args.device)
print("the schema: name, age 0-120, role one of three, an email at example.com")
for title, grammar in [
    ("held to the schema", ("json_schema", json.dumps(USER))),
    ("unconstrained", None),
]:
    params = SamplingParams(max_tokens=80, grammar=grammar)
    recorder = None
    if grammar is not None and args.trace:
        from minisgl.scheduler.trace import TraceRecorder

        recorder = TraceRecorder.attach(llm)
    outputs = llm.generate(PROMPTS, params)
    if recorder is not None:
        recorder.detach()
        recorder.save(args.trace, run=title, example="ch24_structured", prompts=PROMPTS)
    ok = sum(validity(o["text"]) == "valid" for o in outputs)
    print(f"\n{title}: {ok} of {len(PROMPTS)} valid")
    for o in outputs:
        print(f"  {validity(o['text']):<36} {o['text'][:90]!r}")

# ---- one request's mask, step by step -------------------------------------------------------
manager, tokenizer = llm.grammar_manager, llm.tokenizer
vocab = llm.engine.sampler.vocab_size
steps = []
original_fill = manager.fill_mask


def recording_fill(reqs):
    mask = original_fill(reqs)
    if mask is not None:
        bits = (mask[0].cpu().unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
        steps.append(int(bits.sum()))
    return mask


manager.fill_mask = recording_fill
out = llm.generate(
    PROMPTS[3:], SamplingParams(max_tokens=80, grammar=("json_schema", json.dumps(USER)))
)
print(f"\none request, step by step (tokens its grammar allows, of {vocab}):")
for step, (allowed, token) in enumerate(zip(steps, out[0]["token_ids"])):
    if step < 14:
        print(f"  step {step:>2}: {allowed:>6} allowed, picked {tokenizer.decode([token])!r}")
print(f"  ... {len(steps)} steps; answer {out[0]['text']!r}")
llm.shutdown()
