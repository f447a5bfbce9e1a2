"""Chapter 6: the engine driven by hand, the sampler, and the device shims."""

import logging

import pytest
import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig, Sampler
from minisgl.kernel.torch_sampling import seed_key, top_k_top_p_filter
from minisgl.utils.device import NullEvent, NullStream, create_event, create_stream, pin, stream_ctx
from tests.helpers import DEVICE, hf_encode, hf_greedy

PROMPTS = ["The capital of France is", "def fibonacci(n):", "1 + 1 ="]


@pytest.fixture(scope="module")
def engine(qwen3_path):
    eng = Engine(
        EngineConfig(
            str(qwen3_path),
            dtype=torch.float32,
            device=DEVICE,
            max_running_req=4,
            num_page_override=128,
            max_seq_len_override=64,
        )
    )
    yield eng
    eng.shutdown()


def run_by_hand(engine, prompts_ids, steps):
    """Play the scheduler: rows 0.., slots from a counter, one prefill then decodes."""
    reqs = [
        Req(
            torch.tensor(ids, dtype=torch.int32),
            row,
            0,
            steps,
            row,
            SamplingParams(max_tokens=steps),
            None,
        )
        for row, ids in enumerate(prompts_ids)
    ]
    next_slot, generated, phase = 0, [[] for _ in reqs], "prefill"
    feed = torch.cat([r.input_ids for r in reqs])
    for _ in range(steps):
        batch = Batch(reqs, phase)
        for r in reqs:
            n = r.extend_len
            engine.page_table[r.table_idx, r.cached_len : r.device_len] = torch.arange(
                next_slot, next_slot + n
            )
            next_slot += n
        batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs]).to(
            engine.device
        )
        batch.out_loc = torch.cat(
            [engine.page_table[r.table_idx, r.cached_len : r.device_len] for r in reqs]
        )
        batch.input_ids = feed.to(engine.device)
        engine.attn_backend.prepare_metadata(batch)
        out = engine.forward_batch(batch, engine.sampler.prepare(batch))
        out.copy_done_event.synchronize()
        for g, r, t in zip(generated, reqs, out.next_tokens_cpu):
            g.append(int(t))
            r.append_host(t.view(1))
        feed, phase = out.next_tokens_gpu, "decode"
    return generated


def test_hand_driven_batches_match_hf(engine, qwen3_path):
    ids = [hf_encode(qwen3_path, p) for p in PROMPTS]
    with torch.inference_mode():
        assert run_by_hand(engine, ids, 6) == hf_greedy(qwen3_path, PROMPTS, 6)


def test_forward_batch_advances_every_request(engine):
    req = Req(torch.tensor([5, 6, 7], dtype=torch.int32), 0, 0, 2, 0, SamplingParams(), None)
    batch = Batch([req], "prefill")
    engine.page_table[0, :3] = torch.tensor([100, 101, 102])
    batch.positions, batch.out_loc = torch.arange(3, device=engine.device), engine.page_table[0, :3]
    batch.input_ids = req.input_ids.to(engine.device)
    engine.attn_backend.prepare_metadata(batch)
    with torch.inference_mode():
        out = engine.forward_batch(batch, engine.sampler.prepare(batch))
    assert (req.cached_len, req.device_len) == (3, 4)
    assert out.next_tokens_gpu.dtype == torch.int32 and out.next_tokens_cpu.shape == (1,)


def test_kv_pool_is_sized_explicitly_on_the_cpu(qwen3_path):
    said = logging.Handler()  # the engine's log lines, whatever the stream its handler holds
    said.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    lines: list[str] = []
    logging.getLogger("minisgl").addHandler(said)
    try:
        eng = Engine(
            EngineConfig(
                str(qwen3_path),
                dtype=torch.float32,
                device=DEVICE,
                page_size=4,
                kv_memory_cap=2 * 1024**2,
                max_running_req=2,
            )
        )
    finally:
        logging.getLogger("minisgl").removeHandler(said)
    mc = eng.config.model_config
    per_page = 2 * mc.num_layers * 4 * mc.num_kv_heads * mc.head_dim * 4
    assert eng.num_pages == 2 * 1024**2 // per_page
    assert eng.max_seq_len == eng.num_pages * 4 < mc.rotary_config.max_position
    # a context cut short by the pool is said at start-up, not silently served
    warning = f"the context is {eng.max_seq_len} tokens, not {mc.rotary_config.max_position}"
    assert any(line.startswith(warning) for line in lines), lines
    rows = 2  # max_running_req
    rows += 1  # and the dummy request's  # +ch18
    assert eng.page_table.shape[0] == rows and eng.page_table.shape[1] % 32 == 0
    eng.shutdown()


def test_too_small_a_pool_is_refused(qwen3_path):
    with pytest.raises(ValueError, match="not enough memory for the KV cache"):
        Engine(EngineConfig(str(qwen3_path), dtype=torch.float32, device=DEVICE, kv_memory_cap=1))


def batch_of(params):
    return Batch(
        [
            Req(torch.tensor([1], dtype=torch.int32), 0, 0, 1, i, p, None)
            for i, p in enumerate(params)
        ],
        "decode",
    )


def test_greedy_batches_skip_sampling():
    sampler = Sampler(torch.device("cpu"), vocab_size=10)
    args = sampler.prepare(batch_of([SamplingParams(), SamplingParams(top_k=1, temperature=0.5)]))
    assert args.temperatures is None
    logits = torch.randn(2, 10)
    assert torch.equal(sampler.sample(logits, args), logits.argmax(-1))


class _NoArgmax(torch.Tensor):
    """Logits whose ``argmax`` fails: a sampler that takes one on them has wasted a read."""

    def argmax(self, *args, **kwargs):
        raise AssertionError("argmax taken for a batch with no greedy row")


def test_a_batch_with_no_greedy_row_takes_no_argmax():
    sampler = Sampler(torch.device("cpu"), vocab_size=10)
    random = sampler.prepare(batch_of([SamplingParams(temperature=0.7)] * 3))
    mixed = sampler.prepare(batch_of([SamplingParams(temperature=0.7), SamplingParams()]))
    assert not random.any_greedy and mixed.any_greedy
    tokens = sampler.sample(torch.randn(3, 10).as_subclass(_NoArgmax), random)
    assert tokens.shape == (3,) and tokens.dtype == torch.int64


def test_a_greedy_rows_filters_do_not_filter_the_shared_draw():
    """A greedy row takes the argmax whatever its top-k or top-p; left in the batch's filter
    tensors they would send every other row to the filtered sampler."""
    sampler = Sampler(torch.device("cpu"), vocab_size=10)
    args = sampler.prepare(
        batch_of(
            [
                SamplingParams(temperature=0.0, top_p=0.5),
                SamplingParams(top_k=1, temperature=0.5),
                SamplingParams(temperature=0.7),
            ]
        )
    )
    assert args.top_k is None and args.top_p is None
    filtered = sampler.prepare(
        batch_of(
            [SamplingParams(temperature=0.0, top_p=0.5), SamplingParams(top_k=3, temperature=0.7)]
        )
    )
    assert filtered.top_k.tolist() == [10, 3] and filtered.top_p is None


def test_temperature_zero_with_top_p_is_greedy_not_a_division_by_zero():
    sampler = Sampler(torch.device("cpu"), vocab_size=10)
    logits = torch.randn(2, 10)
    args = sampler.prepare(
        batch_of([SamplingParams(temperature=0.0, top_p=0.5), SamplingParams(top_k=1, top_p=0.3)])
    )
    assert torch.equal(sampler.sample(logits, args), logits.argmax(-1))


def test_mixed_batch_keeps_greedy_rows_greedy():
    sampler = Sampler(torch.device("cpu"), vocab_size=50)
    logits = torch.randn(4, 50)
    args = sampler.prepare(batch_of([SamplingParams(), SamplingParams(temperature=1.0)] * 2))
    for _ in range(5):
        tokens = sampler.sample(logits, args)
        assert tokens[0] == logits[0].argmax() and tokens[2] == logits[2].argmax()


def test_top_k_and_top_p_restrict_the_candidates():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda out: (out > float("-inf")).int().tolist()[0]  # noqa: E731
    assert kept(top_k_top_p_filter(logits, torch.tensor([2]), None)) == [1, 1, 0, 0]
    assert kept(top_k_top_p_filter(logits, None, torch.tensor([0.5]))) == [1, 0, 0, 0]
    assert kept(top_k_top_p_filter(logits, None, torch.tensor([0.7]))) == [1, 1, 0, 0]
    assert kept(top_k_top_p_filter(logits, None, torch.tensor([0.01]))) == [1, 0, 0, 0]
    sampler = Sampler(torch.device("cpu"), vocab_size=4)
    args = sampler.prepare(batch_of([SamplingParams(temperature=1.0, top_k=2)] * 64))
    draws = set(sampler.sample(logits.expand(64, -1), args).tolist())
    assert draws <= {0, 1} and len(draws) == 2


def test_sampling_follows_the_distribution_and_is_seeded():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(4000, -1)
    params = batch_of([SamplingParams(temperature=1.0)] * 4000)
    a, b = Sampler(torch.device("cpu"), 3, seed=1), Sampler(torch.device("cpu"), 3, seed=1)
    tokens = a.sample(logits, a.prepare(params))
    assert torch.equal(tokens, b.sample(logits, b.prepare(params)))
    freq = torch.bincount(tokens, minlength=3).float() / 4000
    torch.testing.assert_close(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03, rtol=0)


def _seeded_draw(sampler, logits, params, position=1):
    """Tokens for a batch whose requests all stand at ``position`` (the position drawn)."""
    batch = batch_of(params)
    for r in batch.reqs:
        r.device_len = position
    return sampler.sample(logits, sampler.prepare(batch)).tolist()


def test_a_seeded_request_draws_the_same_token_alone_or_in_any_row_of_a_batch():
    V = 50
    gen = torch.Generator().manual_seed(0)
    mine = torch.randn(V, generator=gen)
    others = torch.randn(7, V, generator=gen)
    me = SamplingParams(temperature=1.0, top_p=0.9, seed=1234)
    neighbours = [SamplingParams(temperature=1.0, seed=None if i % 2 else i) for i in range(7)]
    for position in range(1, 30):
        alone = _seeded_draw(Sampler(torch.device("cpu"), V, seed=1), mine[None], [me], position)
        for row in (0, 3, 7):
            logits = torch.cat([others[:row], mine[None], others[row:]])
            params = neighbours[:row] + [me] + neighbours[row:]
            # another engine seed too: the shared stream does not touch a seeded row
            batched = _seeded_draw(
                Sampler(torch.device("cpu"), V, seed=99), logits, params, position
            )
            assert batched[row] == alone[0], (position, row)


def test_seeded_draws_follow_the_distribution_and_differ_by_seed_and_position():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]])).expand(3000, -1)
    sampler = Sampler(torch.device("cpu"), 3)
    by_seed = _seeded_draw(
        sampler, logits, [SamplingParams(temperature=1.0, seed=s) for s in range(3000)]
    )
    freq = torch.bincount(torch.tensor(by_seed), minlength=3).float() / 3000
    torch.testing.assert_close(freq, torch.tensor([0.6, 0.3, 0.1]), atol=0.03, rtol=0)
    one = [SamplingParams(temperature=1.0, seed=5)]
    by_position = [_seeded_draw(sampler, logits[:1], one, pos)[0] for pos in range(3000)]
    freq = torch.bincount(torch.tensor(by_position), minlength=3).float() / 3000
    torch.testing.assert_close(freq, torch.tensor([0.6, 0.3, 0.1]), atol=0.03, rtol=0)
    assert len({seed_key(s, p) for s in range(-50, 50) for p in range(50)}) == 100 * 50


def test_seed_and_logprobs_out_of_range_raise_naming_the_field():
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=2**63)
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=21)


def test_logprobs_are_the_raw_log_softmax_and_only_for_rows_that_asked():
    sampler = Sampler(torch.device("cpu"), vocab_size=10)
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(3))
    plain = sampler.prepare(batch_of([SamplingParams(temperature=0.5)] * 3))
    assert sampler.logprobs(logits, logits.argmax(-1), plain) is None
    params = [
        SamplingParams(logprobs=2),
        SamplingParams(),
        SamplingParams(temperature=0.5, logprobs=4),
    ]
    args = sampler.prepare(batch_of(params))
    tokens = sampler.sample(logits, args)
    out = sampler.logprobs(logits, tokens, args)
    ref = logits.log_softmax(-1)  # before the temperature of row 2
    assert out.rows == [0, 2] and out.top_ids.shape == (2, 4)
    torch.testing.assert_close(out.token_logprobs, ref[[0, 2], tokens[[0, 2]]])
    lp, ids, tops = out.of_row(2, 4)
    assert ids == ref[2].topk(4).indices.tolist() and tops == sorted(tops, reverse=True)
    assert out.of_row(1, 2) is None and len(out.of_row(0, 2)[1]) == 2


def test_cpu_streams_and_events_are_no_ops():
    cpu = torch.device("cpu")
    stream, event = create_stream(cpu), create_event(cpu)
    assert isinstance(stream, NullStream) and isinstance(event, NullEvent)
    with stream_ctx(stream):
        event.record(stream)
        event.synchronize()
    assert event.query() and not pin(cpu)
