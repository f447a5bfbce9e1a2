"""Exercise 511: the grammar manager's step, on a real llguidance backend built from
SmolLM2's tokenizer (49,152 tokens, EOS id 2). Each case compares the rows ``fill_mask``
returns with what the library itself fills for a matcher at the same place, and checks
what ``advance`` says about where the grammar ends."""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import AutoTokenizer

from minisgl.core import Req, SamplingParams
from minisgl.message import UserMsg
from minisgl.structured import GrammarManager
from minisgl.structured.grammar import GrammarBackend
from tests.helpers import DEVICE as DEVICE_NAME

DEVICE = torch.device(DEVICE_NAME)
VOCAB = 49152
WORDS = VOCAB // 32


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="module")
def backend(tokenizer):
    return GrammarBackend(tokenizer, VOCAB, [tokenizer.eos_token_id])


@pytest.fixture
def manager(backend):
    manager = GrammarManager(lambda: backend, DEVICE)
    yield manager
    manager.shutdown()


def admit(manager: GrammarManager, uid: int, kind: str, text: str) -> Req:
    """A request with a grammar, through the manager's own admission (add, then poll)."""
    params = SamplingParams(grammar=(kind, text), max_tokens=16)
    prompt = torch.tensor([1, 2, 3], dtype=torch.int32)
    manager.add(UserMsg(uid=uid, input_ids=prompt, sampling_params=params))
    for _ in range(400):
        ready, failed = manager.poll(wait_s=0.05)
        assert not failed, failed
        if ready:
            break
    assert uid in manager.matchers, f"request {uid}'s grammar was never admitted"
    return plain(uid, params)


def plain(uid: int, params: SamplingParams | None = None) -> Req:
    prompt = torch.tensor([1, 2, 3], dtype=torch.int32)
    params = params or SamplingParams(max_tokens=16)
    return Req(prompt, table_idx=uid, cached_len=0, output_len=16, uid=uid, sampling_params=params)


def library_row(backend: GrammarBackend, kind: str, text: str, tokens=()) -> torch.Tensor:
    """What the library fills for a fresh matcher of ``(kind, text)`` after ``tokens``."""
    matcher = backend.compile(kind, text)
    for t in tokens:
        assert matcher.accept(t)
    row = torch.full((1, WORDS), -1, dtype=torch.int32)
    backend.fill_bitmask([(matcher, 0)], row)
    return row[0]


def allowed(row: torch.Tensor, token: int) -> bool:
    return bool((int(row[token // 32]) >> (token % 32)) & 1)


def ids(tokenizer, text: str):
    return [tokenizer.convert_tokens_to_ids(c) for c in text]


def test_a_batch_without_grammars_gets_no_mask(manager):
    assert manager.fill_mask([plain(0), plain(1)]) is None, (
        "no request of the batch has a grammar: fill_mask must return None (no mask to apply)"
    )


def test_each_row_is_its_own_requests_mask(manager, backend):
    reqs = [plain(0), admit(manager, 1, "regex", "[0-9]{3}"), plain(2)]
    reqs.append(admit(manager, 3, "choice", json.dumps(["yes", "no"])))
    mask = manager.fill_mask(reqs)
    assert mask is not None and mask.shape == (4, WORDS) and mask.dtype == torch.int32, (
        f"expected a [4, {WORDS}] int32 mask, got {None if mask is None else (mask.shape, mask.dtype)}"
    )
    assert mask.device.type == DEVICE.type, f"the mask must be on {DEVICE}, it is on {mask.device}"
    mask = mask.cpu()
    for row in (0, 2):
        assert bool((mask[row] == -1).all()), f"row {row} has no grammar: it must be all ones (-1)"
    expected = {
        1: library_row(backend, "regex", "[0-9]{3}"),
        3: library_row(backend, "choice", '["yes", "no"]'),
    }
    for row, want in expected.items():
        assert torch.equal(mask[row], want), f"row {row} is not its own request's grammar mask"


def test_advance_moves_the_matcher_and_the_mask_follows(manager, backend, tokenizer):
    req = admit(manager, 5, "regex", "[0-9]{3}")
    one, two = ids(tokenizer, "12")
    assert manager.advance(5, one) is False, "after one digit of three the grammar goes on"
    assert manager.advance(5, two) is False, "after two digits of three the grammar goes on"
    row = manager.fill_mask([req]).cpu()[0]
    assert torch.equal(row, library_row(backend, "regex", "[0-9]{3}", [one, two])), (
        "after '1' and '2' the mask must be the grammar's after those two tokens"
    )
    assert not allowed(row, tokenizer.eos_token_id), "EOS is forbidden before the third digit"


def test_a_request_ends_where_its_grammar_ends(manager, tokenizer):
    admit(manager, 6, "regex", "[0-9]{3}")
    digits = ids(tokenizer, "123")
    said = [manager.advance(6, t) for t in digits]
    assert said == [False, False, True], (
        f"advance said {said} over '1', '2', '3': the third digit ends the grammar (only EOS "
        "could follow), so advance must say True there and the request finishes without a "
        "step spent on EOS"
    )


def test_eos_ends_a_grammar_only_where_it_accepts(manager, backend, tokenizer):
    req = admit(manager, 7, "regex", "a+")
    eos, a = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("a")
    assert not allowed(manager.fill_mask([req]).cpu()[0], eos), "'a+' needs one 'a' before EOS"
    assert manager.advance(7, a) is False, "after 'a' the grammar 'a+' may go on"
    row = manager.fill_mask([req]).cpu()[0]
    assert allowed(row, eos) and allowed(row, a), "after 'a', both EOS and another 'a' fit 'a+'"
    assert manager.advance(7, eos) is True, "EOS where the grammar accepts ends the request"


def test_a_request_without_a_grammar_is_not_ended_by_one(manager, tokenizer):
    admit(manager, 8, "regex", "[0-9]{3}")
    assert manager.advance(9, tokenizer.eos_token_id) is False, (
        "request 9 has no grammar: advance must say False (its own EOS rule is the scheduler's)"
    )


def test_a_token_taken_ahead_is_not_taken_twice(manager, backend, tokenizer):
    req = admit(manager, 10, "regex", "[0-9]{3}")
    one, two = ids(tokenizer, "12")
    assert manager.advance(10, one) is False
    # under overlap: the next step's mask needs token '2' before its results are handled
    assert manager.advance(10, two, ahead=True) is False
    row = manager.fill_mask([req]).cpu()[0]
    assert torch.equal(row, library_row(backend, "regex", "[0-9]{3}", [one, two])), (
        "advance(..., ahead=True) must move the matcher: the next mask needs it"
    )
    assert manager.advance(10, two) is False, "the results' own call for '2' must not move it again"
    row = manager.fill_mask([req]).cpu()[0]
    assert torch.equal(row, library_row(backend, "regex", "[0-9]{3}", [one, two])), (
        "the matcher took '2' twice: once ahead, once with the step's results"
    )


def test_a_finished_requests_row_is_left_open(manager, tokenizer):
    done = admit(manager, 11, "regex", "[0-9]{3}")
    running = admit(manager, 12, "regex", "[0-9]{3}")
    assert [manager.advance(11, t) for t in ids(tokenizer, "123")][-1] is True
    mask = manager.fill_mask([done, running]).cpu()
    assert bool((mask[0] == -1).all()), (
        "request 11's grammar has ended (it is finished, still in the batch in flight): its "
        "row must be left open (-1), not filled"
    )


def test_drawn_choices_are_followed_token_by_token(manager, backend, tokenizer, drawn_seed):
    rng = random.Random(drawn_seed)  # new choices and a new batch order in every judged run
    words = ["red", "green", "blue", "yellow", "purple", "orange", "black", "white"]
    reqs, answers = [], {}
    for uid in range(4):
        choices = rng.sample(words, 3)
        answers[uid] = (json.dumps(choices), rng.choice(choices))
        reqs.append(admit(manager, 20 + uid, "choice", answers[uid][0]))
        reqs.append(plain(40 + uid))
    rng.shuffle(reqs)
    tokens = {
        20 + u: tokenizer.encode(answer, add_special_tokens=False)
        for u, (_, answer) in answers.items()
    }
    for step in range(max(len(t) for t in tokens.values())):
        mask = manager.fill_mask(reqs).cpu()
        for row, req in enumerate(reqs):
            if req.uid not in tokens or step >= len(tokens[req.uid]):
                continue
            choices, answer = answers[req.uid - 20]
            taken = tokens[req.uid][:step]
            assert torch.equal(mask[row], library_row(backend, "choice", choices, taken)), (
                f"step {step}, row {row} (request {req.uid}, {answer!r} of {choices}): the row "
                "is not that request's mask after its tokens so far"
            )
            last = step == len(tokens[req.uid]) - 1
            ended = manager.advance(req.uid, tokens[req.uid][step])
            assert ended is last, (
                f"step {step}, request {req.uid} ({answer!r} of {choices}): advance said "
                f"{ended!r}; the grammar ends with the answer's last token and not before"
            )
