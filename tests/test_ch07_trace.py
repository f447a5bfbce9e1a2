"""The scheduler trace (minisgl/scheduler/trace.py): what it records equals what ran, and every
document it writes is valid against its versioned JSON Schema."""

import json

import jsonschema
import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.env import ENV  # +ch11
from minisgl.llm import LLM
from minisgl.scheduler.trace import SCHEMA_PATH, SCHEMA_VERSION, TraceRecorder
from tests.helpers import DEVICE

PROMPTS = [
    "The capital of France is",
    "List three prime numbers:",
    "def fibonacci(n):",
    "1 + 1 =",
]
LENGTHS = [5, 2, 4, 1]


def build_llm(
    path,
    overlap=False,  # +ch11
    **kwargs,
):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap  # +ch11
    options = dict(
        dtype=torch.float32,
        device=DEVICE,
        attention_backend="torch",
        max_running_req=4,
        num_page_override=256,
        max_seq_len_override=128,
        cache_type="naive",  # +ch09
    )
    options.update(kwargs)
    return LLM(str(path), **options)


def validate(doc):
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(doc)


def record(llm, prompts, lengths):
    """Run ``generate`` under a recorder and, independently, a plain log of each batch."""
    batches, original = [], llm._forward

    def logged(forward_input):
        b = forward_input.batch
        batches.append((b.phase, [(r.uid, r.cached_len, r.device_len) for r in b.reqs]))
        return original(forward_input)

    llm._forward = logged
    rec = TraceRecorder.attach(llm)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    outputs = llm.generate(prompts, params)
    return rec, outputs, batches


def sampled_by_uid(doc):
    out = {}
    for step in doc["steps"]:
        for r in step["reqs"]:
            if r["sampled"] is not None:
                out.setdefault(r["uid"], []).append(r["sampled"])
    return out


def test_naive_trace_is_valid_and_equals_the_run(qwen3_path, tmp_path, capsys):
    llm = build_llm(qwen3_path)
    rec, outputs, batches = record(llm, PROMPTS, LENGTHS)
    path = rec.save(tmp_path / "t.json", run="the test's run", example="test")
    doc = json.loads(path.read_text())
    llm.shutdown()
    validate(doc)
    assert doc["version"] == SCHEMA_VERSION
    assert doc["meta"] == {"run": "the test's run", "example": "test"}
    told = capsys.readouterr()
    assert f"wrote the trace of the test's run to {path}" in told.err and str(path) not in told.out
    assert doc["config"]["cache_type"] == "naive" and doc["config"]["overlap"] is False
    assert [(s["kind"], [(r["uid"], r["cached_len"], r["device_len"]) for r in s["reqs"]])
            for s in doc["steps"]] == batches  # fmt: skip
    assert [s["index"] for s in doc["steps"]] == list(range(len(batches)))
    # every token each request produced, in order, and nothing else
    assert sampled_by_uid(doc) == {i: o["token_ids"] for i, o in enumerate(outputs)}
    assert [(r["uid"], r["prompt_len"], r["max_tokens"]) for r in doc["requests"]] == [
        (i, len(llm.tokenizer.encode(p)), n) for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS))
    ]
    num_pages = doc["config"]["num_pages"]
    held = {}  # uid -> pages
    for step in doc["steps"]:
        assert step["num_tokens"] == sum(r["extend_len"] for r in step["reqs"])
        owners = {}
        for row in step["rows"]:
            assert len(row["pages"]) == row["len"]  # page size 1: a page per position
            for p in row["pages"]:
                assert 0 <= p < num_pages and owners.setdefault(p, row["uid"]) == row["uid"]
        for r in step["reqs"]:
            assert r["extend_len"] == r["device_len"] - r["cached_len"]
            fresh = r["pages"][r["cached_len"] :]  # page size 1: a page per position
            assert r["new_pages"] == [p for p in fresh if p not in held.get(r["uid"], [])]
            assert len(r["new_pages"]) == r["extend_len"]
            held[r["uid"]] = r["pages"]
            # the batch's rows are in the step's page table, with the same pages
            assert {"row": r["row"], "uid": r["uid"], "len": r["device_len"], "pages": r["pages"]} in step["rows"]  # fmt: skip
        finished = [r for r in step["reqs"] if r["finished"]]
        # a finished request's pages (the naive cache keeps none) go back to the free list
        assert sorted(p for r in finished for p in r["pages"]) == step["freed"]
    assert doc["steps"][-1]["free_pages"] == num_pages
    assert {r["uid"] for s in doc["steps"] for r in s["reqs"] if r["finished"]} == set(range(4))


def test_detach_restores_the_scheduler(qwen3_path):
    llm = build_llm(qwen3_path)
    assert not {"_prepare_batch", "_forward", "_process_last_data"} & set(vars(llm))
    rec = TraceRecorder.attach(llm)
    assert {"_prepare_batch", "_forward", "_process_last_data"} <= set(vars(llm))
    rec.detach()
    assert not {"_prepare_batch", "_forward", "_process_last_data"} & set(vars(llm))
    assert "evict" not in vars(llm.cache_manager.prefix_cache)
    llm.generate(["1 + 1 ="], SamplingParams(max_tokens=2, ignore_eos=True))
    llm.shutdown()
    assert rec.steps == []


def test_a_broken_document_is_rejected():
    doc = {"format": "minisgl-trace", "version": SCHEMA_VERSION, "meta": {}, "config": {}}
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)
