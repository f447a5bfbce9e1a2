"""Structured output, measured: how often answers validate, and what the mask costs a step.

    python -m minisgl.benchmark.structured validity [--model PATH] [--device cpu|cuda] [--n 100]
    python -m minisgl.benchmark.structured mask-cost [--model PATH] [--batch-sizes 1 16 64]
    python -m minisgl.benchmark.structured kernel [--vocab 151936] [--batch-sizes 1 16 64]
    python -m minisgl.benchmark.structured fill [--model PATH] [--batch-sizes 1 16 64]

``validity`` asks for ``n`` JSON answers, cycling through ``SCHEMAS`` (nested objects, arrays,
enums, bounded numbers, optional fields, patterns), each prompt the chat template around the
schema, sampled at temperature 0.7 with a seed per request: once held to the schema, once
free. An answer counts as valid when the whole text parses (``json.loads``) and validates
(``jsonschema``). ``mask-cost`` runs ``--steps`` decode steps at each batch size, with overlap
scheduling on and off, every request free or every request held to a JSON array of at least
1,000 strings (so no grammar ends within the budget, and most steps are inside a string, where
the mask allows most of the vocabulary: the library's slowest case); it prints milliseconds
per step (the best of two runs) and the difference the grammar makes.
``kernel`` (CUDA) times the mask alone on ``[B, vocab]`` bf16 logits with a random mask: the
book's Triton kernel, the torch reference, and llguidance's own ``apply_token_bitmask_inplace``.
``fill`` times the CPU's part of a step alone, no model: the library filling ``B`` rows of
the mask in one call, for matchers inside a JSON string (most of the vocabulary allowed) and
between a schema's fields (a few tokens allowed), with the model's tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Dict, List, Tuple

import torch

from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.llm import LLM

SCHEMAS: Dict[str, Dict[str, Any]] = {
    "user": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 30},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "address": {
        "type": "object",
        "properties": {
            "street": {"type": "string", "maxLength": 40},
            "city": {"type": "string", "maxLength": 30},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
        },
        "required": ["street", "city", "zip"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 1},
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                        "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                    },
                    "required": ["sku", "quantity"],
                    "additionalProperties": False,
                },
                "minItems": 1,
                "maxItems": 3,
            },
        },
        "required": ["id", "items"],
        "additionalProperties": False,
    },
    "sentiment": {
        "type": "object",
        "properties": {
            "label": {"enum": ["positive", "negative", "neutral"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["label", "confidence"],
        "additionalProperties": False,
    },
    "book": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 50},
            "year": {"type": "integer", "minimum": 1450, "maximum": 2030},
            "isbn": {"type": "string", "pattern": "^97[89][0-9]{10}$"},
            "subtitle": {"type": "string", "maxLength": 50},
        },
        "required": ["title", "year"],
        "additionalProperties": False,
    },
    "event": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
            "attendees": {
                "type": "array",
                "items": {"type": "string", "maxLength": 20},
                "maxItems": 4,
            },
        },
        "required": ["name", "date", "attendees"],
        "additionalProperties": False,
    },
    "weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "celsius": {"type": "number", "minimum": -60, "maximum": 60},
            "conditions": {"enum": ["sunny", "cloudy", "rain", "snow"]},
        },
        "required": ["city", "celsius", "conditions"],
        "additionalProperties": False,
    },
    "product": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "price": {"type": "number", "exclusiveMinimum": 0, "maximum": 10000},
            "tags": {"type": "array", "items": {"enum": ["new", "sale", "eco"]}, "maxItems": 3},
            "in_stock": {"type": "boolean"},
        },
        "required": ["name", "price", "in_stock"],
        "additionalProperties": False,
    },
    "company": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "ceo": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 30},
                    "since": {"type": "integer", "minimum": 1900, "maximum": 2026},
                },
                "required": ["name"],
                "additionalProperties": False,
            },
            "employees": {"type": "integer", "minimum": 1},
        },
        "required": ["name", "ceo"],
        "additionalProperties": False,
    },
    "color": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"},
            "rgb": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 255},
                "minItems": 3,
                "maxItems": 3,
            },
        },
        "required": ["name", "hex", "rgb"],
        "additionalProperties": False,
    },
}


def is_valid(text: str, schema: Dict[str, Any]) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def validity(llm: LLM, n: int, max_tokens: int) -> None:
    names = [list(SCHEMAS)[i % len(SCHEMAS)] for i in range(n)]
    prompts = [
        llm.tokenizer.apply_chat_template(
            [
                {
                    "role": "user",
                    "content": f"Invent a {name} record. Reply with one JSON object that "
                    f"matches this JSON schema, and nothing else:\n{json.dumps(SCHEMAS[name])}",
                }
            ],
            tokenize=False,
            add_generation_prompt=True,
        )
        for name in names
    ]
    rows: List[Tuple[str, int, float, int]] = []
    for title, held in (("held to the schema", True), ("free", False)):
        params = [
            SamplingParams(
                temperature=0.7,
                seed=i,
                max_tokens=max_tokens,
                grammar=("json_schema", json.dumps(SCHEMAS[name])) if held else None,
            )
            for i, name in enumerate(names)
        ]
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        seconds = time.perf_counter() - start
        valid = sum(is_valid(o["text"], SCHEMAS[name]) for o, name in zip(outputs, names))
        tokens = sum(len(o["token_ids"]) for o in outputs)
        rows.append((title, valid, seconds, tokens))
    print(f"{n} answers over {len(SCHEMAS)} schemas ({', '.join(SCHEMAS)}):")
    for title, valid, seconds, tokens in rows:
        print(
            f"  {title:<20} {valid:>4} of {n} valid ({valid / n:.0%}), "
            f"{tokens} tokens in {seconds:.1f} s"
        )


LONG_ARRAY = json.dumps({"type": "array", "items": {"type": "string"}, "minItems": 1000})


def mask_cost(llm: LLM, batch_sizes: List[int], steps: int) -> None:
    counted = {"steps": 0}
    forward = llm._forward

    def counting_forward(forward_input):
        counted["steps"] += 1
        return forward(forward_input)

    llm._forward = counting_forward
    vocab_len = llm.engine.sampler.vocab_size
    prompt = list(range(100, 116))
    print(f"ms per step over {steps} steps (vocabulary {vocab_len}):")
    print(f"  {'batch':>5} {'overlap':>8} {'free':>8} {'grammar':>8} {'cost':>8}")
    for B in batch_sizes:
        for overlap in (True, False):
            ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
            times = {}
            for name, grammar in (("free", None), ("grammar", ("json_schema", LONG_ARRAY))):
                params = SamplingParams(max_tokens=steps, ignore_eos=True, grammar=grammar)
                llm.generate([prompt] * B, params)  # warm: the grammar compiled, kernels built
                runs = []
                for _ in range(2):
                    counted["steps"] = 0
                    start = time.perf_counter()
                    llm.generate([prompt] * B, params)
                    runs.append((time.perf_counter() - start) * 1e3 / counted["steps"])
                times[name] = min(runs)
            print(
                f"  {B:>5} {'on' if overlap else 'off':>8} {times['free']:>8.3f} "
                f"{times['grammar']:>8.3f} {times['grammar'] - times['free']:>+8.3f}"
            )
    ENV.DISABLE_OVERLAP_SCHEDULING.value = False


def kernel(vocab: int, batch_sizes: List[int]) -> None:
    import llguidance.torch

    from minisgl.benchmark.common import cuda_time_ms
    from minisgl.kernel.bitmask import apply_token_bitmask_reference
    from minisgl.kernel.triton.bitmask import apply_token_bitmask_triton

    impls = {
        "triton (book)": apply_token_bitmask_triton,
        "torch reference": apply_token_bitmask_reference,
        "llguidance": llguidance.torch.apply_token_bitmask_inplace,
    }
    print(f"microseconds to mask [B, {vocab}] bf16 logits:")
    print(f"  {'B':>4} " + " ".join(f"{name:>16}" for name in impls))
    for B in batch_sizes:
        logits = torch.randn(B, vocab, device="cuda", dtype=torch.bfloat16)
        words = (vocab + 31) // 32
        mask = torch.randint(-(2**31), 2**31 - 1, (B, words), dtype=torch.int32, device="cuda")
        us = [cuda_time_ms(lambda f=f: f(logits, mask), iters=200) * 1e3 for f in impls.values()]
        print(f"  {B:>4} " + " ".join(f"{t:>16.1f}" for t in us))


def fill(model: str, batch_sizes: List[int], repeats: int = 20) -> None:
    from minisgl.structured import GrammarBackend
    from minisgl.utils import load_eos_token_ids, load_tokenizer

    tokenizer = load_tokenizer(model)
    vocab = len(tokenizer)
    backend = GrammarBackend(tokenizer, vocab, load_eos_token_ids(model, tokenizer))
    places = {
        "inside a string": (LONG_ARRAY, '["a sentence that'),
        "between fields": (json.dumps(SCHEMAS["weather"]), '{"city": "Oslo", '),
    }
    print(f"ms to fill B rows of the mask (vocabulary {vocab}, {model}):")
    print(f"  {'B':>4} " + " ".join(f"{name:>16}" for name in places))
    for B in batch_sizes:
        row = []
        for schema, text in places.values():
            start = backend.compile("json_schema", schema)
            matchers = [start.copy() for _ in range(B)]
            for m in matchers:
                for token in tokenizer.encode(text, add_special_tokens=False):
                    assert m.accept(token), text
            bitmask = torch.full((B, (vocab + 31) // 32), -1, dtype=torch.int32)
            rows = [(m, i) for i, m in enumerate(matchers)]
            backend.fill_bitmask(rows, bitmask)
            t = time.perf_counter()
            for _ in range(repeats):
                backend.fill_bitmask(rows, bitmask)
            row.append((time.perf_counter() - t) * 1e3 / repeats)
        print(f"  {B:>4} " + " ".join(f"{ms:>16.3f}" for ms in row))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["validity", "mask-cost", "kernel", "fill"])
    p.add_argument(
        "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--n", type=int, default=100, help="validity: answers of each kind")
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--steps", type=int, default=128, help="mask-cost: decode steps per run")
    p.add_argument("--vocab", type=int, default=151_936, help="kernel: logits per row (Qwen3's)")
    args = p.parse_args()
    if args.what == "kernel":
        return kernel(args.vocab, args.batch_sizes)
    if args.what == "fill":
        return fill(args.model, args.batch_sizes)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    llm = LLM(args.model, dtype=dtype, device=args.device)
    try:
        if args.what == "validity":
            validity(llm, args.n, args.max_tokens)
        else:
            mask_cost(llm, args.batch_sizes, args.steps)
    finally:
        llm.shutdown()


if __name__ == "__main__":
    main()
