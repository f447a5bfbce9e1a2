"""Chapter 24: structured output. The bitmask op, the grammar layer, the scheduler's grammar
manager, and SmolLM2 (CPU, float32) held to schemas, regexes and choices offline and through
the server: every constrained answer parses and validates."""

import importlib.util
import json
import time
from collections import Counter
from unittest import mock

import jsonschema
import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.kernel.bitmask import apply_token_bitmask, apply_token_bitmask_reference
from minisgl.llm import LLM
from minisgl.message import UserMsg
from minisgl.scheduler.retract import NewTokenRatio, RetractManager
from minisgl.structured import GrammarError, GrammarManager, check_grammar
from tests.helpers import DEVICE
from tests.helpers.interpreter import interpret

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(
    not HAS_TRITON, reason="triton is not installed (pip install triton)"
)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
STORY = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 60, "maxLength": 80}},
    "required": ["story"],
    "additionalProperties": False,
}


def random_bitmask(B: int, V: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(
        -(2**31), 2**31 - 1, (B, (V + 31) // 32), dtype=torch.int32, generator=generator
    )


# ---- the mask ---------------------------------------------------------------------------------


def test_the_reference_mask_forbids_exactly_the_tokens_whose_bit_is_zero(drawn_seed):
    g = torch.Generator().manual_seed(drawn_seed)
    B, V = 3, 77  # V not a multiple of 32: the last word's high bits are past the vocabulary
    logits, bitmask = torch.randn(B, V, generator=g), random_bitmask(B, V, g)
    masked = logits.clone()
    apply_token_bitmask_reference(masked, bitmask)
    for b in range(B):
        for j in range(V):
            allowed = (int(bitmask[b, j // 32]) >> (j % 32)) & 1
            assert masked[b, j] == (logits[b, j] if allowed else float("-inf"))


def check_triton_mask(device: str, seed: int) -> None:
    """The Triton kernel (float32, and bf16 on a GPU) writes exactly the reference's ``-inf``s."""
    from minisgl.kernel import library_for

    g = torch.Generator().manual_seed(seed)
    B, V = 5, 5000  # two blocks of the kernel, the second one partial
    half = torch.bfloat16 if device == "cuda" else torch.float16  # older interpreters lack bf16
    for dtype in (torch.float32, half):
        logits = torch.randn(B, V, generator=g).to(device, dtype)
        bitmask = random_bitmask(B, V, g).to(device)
        assert library_for("apply_token_bitmask", logits, bitmask) == "triton"
        expected = logits.clone()
        apply_token_bitmask_reference(expected, bitmask)
        apply_token_bitmask(logits, bitmask)
        assert torch.equal(logits, expected), dtype


@needs_triton
def test_the_triton_mask_equals_the_reference_in_the_interpreter(drawn_seed):
    script = f"from test_ch24_structured import check_triton_mask\ncheck_triton_mask('cpu', {drawn_seed})\nprint('mask ok')"
    res = interpret(script)
    assert res.returncode == 0 and "mask ok" in res.stdout, res.stderr[-3000:]


@pytest.mark.gpu
def test_the_triton_mask_equals_the_reference_on_the_gpu(drawn_seed):
    check_triton_mask("cuda", drawn_seed)


def test_a_mask_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match=r"bitmask must be \[2, 4\] int32"):
        apply_token_bitmask(torch.zeros(2, 100), torch.zeros(2, 3, dtype=torch.int32))


# ---- grammars ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, text, message",
    [
        ("regex", "a(b", "unclosed group"),
        ("json_schema", '{"type": "nonsense"}', "nonsense"),
        ("json_schema", "{not json", "invalid json_schema"),
        ("choice", "[]", "non-empty list of strings"),
        ("ebnf", "root ::= (", "invalid ebnf"),
        ("yaml", "", "unknown grammar kind"),
    ],
)
def test_an_invalid_grammar_is_refused_with_the_reason(kind, text, message):
    with pytest.raises(GrammarError, match=message):
        check_grammar(kind, text)


def test_valid_grammars_pass_the_check():
    for kind, text in [
        ("json_object", ""),
        ("json_schema", json.dumps(PERSON)),
        ("regex", r"\d{3}-\d{4}"),
        ("choice", '["yes", "no"]'),
        ("ebnf", 'root ::= "a" | "b"'),
    ]:
        check_grammar(kind, text)


class SlowBackend:
    """Compiles nothing: each compile sleeps ``delay`` seconds, then fails or succeeds."""

    vocab_size = 64

    def __init__(self, delay: float) -> None:
        self.delay, self.compiled = delay, Counter()

    def compile(self, kind, text):
        self.compiled[(kind, text)] += 1
        time.sleep(self.delay)
        if text == "bad":
            raise GrammarError("invalid regex: bad")
        return mock.Mock(copy=lambda: f"matcher of {text}")


def user_msg(uid: int, text: str) -> UserMsg:
    params = SamplingParams(grammar=("regex", text))
    return UserMsg(uid=uid, input_ids=torch.tensor([1], dtype=torch.int32), sampling_params=params)


def poll_until_settled(manager: GrammarManager):
    ready, failed = [], []
    for _ in range(200):
        r, f = manager.poll(wait_s=0.05)
        ready, failed = ready + r, failed + f
        if not manager.waiting:
            return ready, failed
    raise AssertionError("the manager never settled")


def test_a_grammar_compiles_once_and_each_request_gets_its_own_matcher():
    backend = SlowBackend(0.01)
    manager = GrammarManager(lambda: backend, torch.device("cpu"))
    for uid in range(3):
        manager.add(user_msg(uid, "a+"))
    manager.add(user_msg(3, "bad"))
    ready, failed = poll_until_settled(manager)
    assert sorted(m.uid for m in ready) == [0, 1, 2]
    assert [(m.uid, e) for m, e in failed] == [(3, "invalid regex: bad")]
    assert backend.compiled == Counter({("regex", "a+"): 1, ("regex", "bad"): 1})
    assert set(manager.matchers) == {0, 1, 2}
    manager.release(1)
    assert set(manager.matchers) == {0, 2}
    manager.shutdown()


def test_a_grammar_slower_than_the_limit_fails_its_request_and_nothing_waits():
    manager = GrammarManager(lambda: SlowBackend(1.0), torch.device("cpu"), compile_timeout_s=0.1)
    manager.add(user_msg(7, "a+"))
    assert manager.poll() == ([], [])  # still compiling: nothing blocks
    ready, failed = poll_until_settled(manager)
    assert ready == [] and [m.uid for m, _ in failed] == [7]
    assert failed[0][1] == "the regex took longer than 0.1 s to compile"
    assert not manager.matchers
    manager.shutdown()


def test_a_compile_that_failed_for_another_reason_than_its_grammar_is_retried():
    backend = SlowBackend(0.01)
    broken = mock.Mock(side_effect=[MemoryError("out of memory"), backend.compile("regex", "a+")])
    manager = GrammarManager(lambda: mock.Mock(compile=broken), torch.device("cpu"))
    manager.add(user_msg(1, "a+"))
    ready, failed = poll_until_settled(manager)
    assert failed[0][1] == "the grammar could not be compiled: out of memory"
    manager.add(user_msg(2, "a+"))  # not served the cached failure: compiled again
    ready, failed = poll_until_settled(manager)
    assert [m.uid for m in ready] == [2] and not failed and broken.call_count == 2
    manager.shutdown()


def test_an_aborted_request_leaves_the_waiting_list():
    manager = GrammarManager(lambda: SlowBackend(0.5), torch.device("cpu"))
    manager.add(user_msg(1, "a+"))
    assert manager.drop_waiting(1) and not manager.waiting
    manager.shutdown()


# ---- SmolLM2, offline -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm(smollm2_path):
    engine = LLM(str(smollm2_path), dtype=torch.float32, device=DEVICE)
    yield engine
    engine.shutdown()


def schema_params(schema, **kwargs) -> SamplingParams:
    return SamplingParams(grammar=("json_schema", json.dumps(schema)), **kwargs)


PROMPTS = [
    "Describe the administrator of a small website as JSON.",
    "Here is a guest user record in JSON:",
    "Write one JSON object about a person.",
]


def test_every_answer_held_to_a_schema_validates(llm, drawn_seed):
    params = [
        schema_params(PERSON, max_tokens=120),
        schema_params(PERSON, max_tokens=120, temperature=1.0, seed=drawn_seed),
        schema_params(PERSON, max_tokens=120, temperature=0.7, top_p=0.9, seed=drawn_seed + 1),
    ]
    for out in llm.generate(PROMPTS, params):
        jsonschema.validate(json.loads(out["text"]), PERSON)
        assert out["token_ids"][-1] not in llm.eos_token_ids  # ended by the grammar's EOS


def test_a_regex_and_a_choice_are_honoured(llm, drawn_seed):
    regex = r"(yes|no), [0-9]{2,3} (apples|pears)"
    outs = llm.generate(
        ["Answer: ", "Pick a fruit: "],
        [
            SamplingParams(
                max_tokens=30, temperature=1.0, seed=drawn_seed, grammar=("regex", regex)
            ),
            SamplingParams(max_tokens=30, grammar=("choice", '["banana split", "cherry"]')),
        ],
    )
    import re

    assert re.fullmatch(regex, outs[0]["text"]), outs[0]["text"]
    assert outs[1]["text"] in ("banana split", "cherry")


def test_the_unconstrained_answer_is_untouched_beside_a_constrained_one(llm):
    alone = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=12))[0]
    together = llm.generate(
        PROMPTS[:2], [SamplingParams(max_tokens=12), schema_params(PERSON, max_tokens=12)]
    )[0]
    assert together["token_ids"] == alone["token_ids"]


def test_logprobs_are_the_models_own_before_the_mask(llm):
    """The grammar forces ``{``, which the unconstrained model does not put first: the reported
    logprob of the forced token is below its best alternative's (a masked distribution would
    give the forced token the best logprob, 0 when it is the only one allowed)."""
    prompt = ["Once upon a time"]
    free = llm.generate(prompt, SamplingParams(max_tokens=1, logprobs=1))[0]
    forced = llm.generate(prompt, schema_params(PERSON, max_tokens=1, logprobs=1))[0]
    assert forced["text"].startswith("{") and not free["text"].startswith("{")
    logprob, [(best_id, best_logprob)] = forced["logprobs"][0]
    assert best_id == free["token_ids"][0] and logprob < best_logprob


def test_overlap_scheduling_gives_the_same_constrained_answers(smollm2_path, monkeypatch):
    """Under overlap each matcher takes its token ahead, while the next step's model runs
    (``Scheduler._grammar_mask``); without, when the results are handled. Same answers."""
    real_advance = GrammarManager.advance
    answers, taken_ahead = {}, {}
    for overlap in (False, True):
        monkeypatch.setattr(ENV, "DISABLE_OVERLAP_SCHEDULING", not overlap)
        calls = Counter()

        def advance(self, uid, token, ahead=False):
            calls[ahead] += 1
            return real_advance(self, uid, token, ahead)

        engine = LLM(str(smollm2_path), dtype=torch.float32, device=DEVICE)
        try:
            with mock.patch.object(GrammarManager, "advance", advance):
                outs = engine.generate(PROMPTS, schema_params(PERSON, max_tokens=80))
        finally:
            engine.shutdown()
        answers[overlap] = [o["text"] for o in outs]
        taken_ahead[overlap] = calls[True]
    assert answers[True] == answers[False]
    for text in answers[True]:
        jsonschema.validate(json.loads(text), PERSON)
    assert taken_ahead[False] == 0 and taken_ahead[True] > 0  # every decode token, under overlap


def test_a_retracted_constrained_request_still_validates(smollm2_path):
    """A pool of 150 one-token pages and three copies of a prompt whose greedy answer is 85
    tokens (282 in all, prompts included): decode outgrows the pool, requests are retracted
    and resume with their matchers where their tokens left them; every answer equals the one
    computed alone and validates."""
    retracted = Counter()
    real = RetractManager.retract_decode

    def counted(self, scheduler):
        out = real(self, scheduler)
        retracted.update(p.uid for p in out)
        return out

    params = schema_params(STORY, max_tokens=100)
    engine = LLM(str(smollm2_path), dtype=torch.float32, device=DEVICE)
    try:
        alone = engine.generate(PROMPTS[1:2], params)[0]["text"]
    finally:
        engine.shutdown()
    engine = LLM(
        str(smollm2_path),
        dtype=torch.float32,
        device=DEVICE,
        num_page_override=150,
        enable_retraction=True,
    )
    # admission reserves a tenth of each output: all three start, and outgrow the pool
    engine.retract_manager.new_token_ratio = NewTokenRatio(init=0.1, floor=0.1)
    try:
        with mock.patch.object(RetractManager, "retract_decode", counted):
            together = [o["text"] for o in engine.generate(PROMPTS[1:2] * 3, params)]
    finally:
        engine.shutdown()
    assert sum(retracted.values()) >= 1
    assert together == [alone] * 3
    jsonschema.validate(json.loads(alone), STORY)


# ---- the server -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grammar_server(smollm2_path, tmp_path_factory):
    """A server whose grammars must compile in 10 ms: the first one also builds the library's
    tokenizer (about 0.4 s for SmolLM2), so it is late; later ones take about a millisecond."""
    from tests.helpers.server import Server

    s = Server(
        smollm2_path, tmp_path_factory.mktemp("grammar") / "server.log", "--grammar-timeout", "0.01"
    ).wait_ready()
    yield s
    assert s.stop() == 0, s.output()[-3000:]


def post(server, path: str, body: dict):
    import httpx

    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


CHAT = {"model": "SmolLM2-135M-Instruct", "max_tokens": 120, "temperature": 0}
MESSAGES = [{"role": "user", "content": "Describe the administrator of a small website."}]


def test_the_server_answers_400s_for_bad_grammars_and_a_slow_compile_and_stays_healthy(
    grammar_server,
):
    from tests.helpers.server import wait_until_idle

    person = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    slow = post(
        grammar_server,
        "/v1/chat/completions",
        {**CHAT, "messages": MESSAGES, "response_format": person},
    )
    assert slow.status_code == 400
    assert slow.json()["error"]["message"] == "the json_schema took longer than 0.01 s to compile"
    cases = [
        ({"regex": "a(b"}, "regex", "unclosed group"),
        ({"json_schema": {"type": "nonsense"}}, "json_schema", "nonsense"),
        ({"regex": "a+", "choice": ["a"]}, "choice", "at most one output constraint"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "needs its json_schema"),
    ]
    for fields, param, message in cases:
        r = post(grammar_server, "/v1/chat/completions", {**CHAT, "messages": MESSAGES, **fields})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and message in error["message"], error
    r = post(grammar_server, "/generate", {"prompt": "x", "ebnf": "root ::= ("})
    assert r.status_code == 400 and r.json()["error"]["param"] == "ebnf"
    wait_until_idle(grammar_server)  # nothing left open, running or waiting
    assert grammar_server.get("/health")["status"] == "ok"


def test_the_server_holds_answers_to_schemas_regexes_and_choices(grammar_server):
    person = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    post(
        grammar_server,
        "/v1/chat/completions",
        {**CHAT, "messages": MESSAGES, "response_format": person},
    )  # the first grammar is late (see the fixture): this one is cached by then
    client = grammar_server.client()
    chat = client.chat.completions.create(
        model=CHAT["model"],
        messages=MESSAGES,
        max_tokens=120,
        temperature=0,
        response_format=person,
    )
    jsonschema.validate(json.loads(chat.choices[0].message.content), PERSON)
    anything = client.chat.completions.create(
        model=CHAT["model"],
        messages=MESSAGES,
        max_tokens=120,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(anything.choices[0].message.content), dict)
    stream = client.completions.create(
        model=CHAT["model"],
        prompt="The answer is",
        max_tokens=20,
        temperature=0,
        stream=True,
        extra_body={"regex": "(yes|no) because [a-z ]{5,20}\\."},
    )
    import re

    assert re.fullmatch(
        r"(yes|no) because [a-z ]{5,20}\.", "".join(c.choices[0].text for c in stream)
    )
    out = post(
        grammar_server,
        "/generate",
        {"prompt": "Pick:", "choice": ["red", "green"], "max_tokens": 5},
    )
    assert out.json()["text"] in ("red", "green")


def test_a_stop_string_cuts_a_constrained_answer_before_its_grammar_ends(grammar_server):
    """The grammar shapes every token; the stop string, checked on the text as for any
    request (chapter 15), ends the answer where it appears, even mid-grammar: the client asked
    for both, and the stop string is the later, explicit limit."""
    post(grammar_server, "/generate", {"prompt": "x", "regex": "[ab]", "max_tokens": 2})  # warm
    body = {"prompt": "Answer:", "regex": "(yes|no), [0-9]{3}", "max_tokens": 20, "stop": [", "]}
    out = post(grammar_server, "/generate", body).json()
    assert out["text"] in ("yes", "no") and out["finish_reason"] == "stop", out


def test_tensor_parallel_ranks_admit_a_grammar_in_the_same_step():
    """Ranks run the same schedule: in lockstep the first poll after ``add`` waits for the
    compile, however long it takes, and no time limit applies."""
    manager = GrammarManager(
        lambda: SlowBackend(0.2), torch.device("cpu"), compile_timeout_s=0.01, lockstep=True
    )
    manager.add(user_msg(3, "a+"))
    ready, failed = manager.poll()
    assert [m.uid for m in ready] == [3] and failed == []
    manager.shutdown()
