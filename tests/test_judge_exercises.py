"""How the judge reads an exercise: TOML front matter, the starter it generates from the
engine module, the known wrong answers of ``broken/``, and the signature comparison."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from practice.judgelib import broken
from practice.judgelib.problems import parse_front_matter
from practice.judgelib.signatures import drift
from practice.judgelib.starter import StarterError, make_starter

ENGINE = '''\
"""An engine module."""

import functools


class Pool:
    """Slots."""

    shared = True  # a class attribute an exercise may leave out

    def __init__(self, n: int) -> None:
        self.free = list(range(n))

    @property
    def size(self) -> int:
        """How many are free."""
        return len(self.free)

    @functools.lru_cache(maxsize=None)  # noqa: B019
    def take(
        self,
        k: int = 1,
    ) -> list:
        # the first k: the order matters to the tests
        out, self.free = self.free[:k], self.free[k:]
        return out


def pairs(xs):
    """Each pair of neighbours."""
    for a, b in zip(xs, xs[1:]):
        yield a, b


async def ticks(n: int):
    for i in range(n):
        yield i
'''


def starter(*symbols: str, omit: tuple = ()) -> str:
    return make_starter(ENGINE, 901, symbols, "minisgl/pool.py", omit)


def test_only_the_bodies_change_signatures_decorators_and_docstrings_stay():
    out = starter("Pool.size", "Pool.take")
    assert out == ENGINE.replace(
        "        return len(self.free)\n",
        '        raise NotImplementedError("Exercise 901: implement Pool.size")\n',
    ).replace(
        "        # the first k: the order matters to the tests\n"
        "        out, self.free = self.free[:k], self.free[k:]\n"
        "        return out\n",
        '        raise NotImplementedError("Exercise 901: implement Pool.take")\n',
    )
    assert drift(out, ENGINE) == ([], [])


def test_a_generator_stays_a_generator_that_raises_when_iterated():
    namespace: dict = {}
    exec(starter("pairs", "ticks"), namespace)
    gen = namespace["pairs"]([1, 2, 3])  # calling it does not raise yet, as in the engine
    with pytest.raises(NotImplementedError, match="Exercise 901: implement pairs"):
        next(gen)

    async def consume() -> None:
        async for _ in namespace["ticks"](3):
            pass

    with pytest.raises(NotImplementedError, match="Exercise 901: implement ticks"):
        asyncio.run(consume())


def test_omit_leaves_a_statement_out_with_its_blank_line():
    out = starter("Pool.size", omit=("Pool.shared",))
    assert "shared" not in out
    assert '    """Slots."""\n\n    def __init__' in out


@pytest.mark.parametrize(
    "symbols, omit, message",
    [
        (("Pool.grow",), (), "exercise 901: Pool.grow is not defined in minisgl/pool.py"),
        (("Pool",), (), "exercise 901: Pool is a class in minisgl/pool.py; name its methods"),
        (("pairs", "pairs"), (), "exercise 901: pairs is listed twice"),
        (("pairs",), ("Pool.gone",), "exercise 901: Pool.gone (omit) is not defined"),
        ((), (), "exercise 901: no symbols to write in minisgl/pool.py"),
    ],
)
def test_a_symbol_that_does_not_fit_the_engine_is_named(symbols, omit, message):
    with pytest.raises(StarterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        starter(*symbols, omit=omit)


def test_a_body_on_the_def_line_is_refused_not_mangled():
    with pytest.raises(StarterError, match="f in m.py: its body shares a line with the def"):
        make_starter("def f(): return 1\n", 7, ["f"], "m.py")


def test_drift_names_the_signature_that_differs():
    problems, _ = drift(ENGINE.replace("k: int = 1", "k: int = 2"), ENGINE)
    assert problems == [
        "Pool.take: signature differs\n"
        "    engine:  @functools.lru_cache(maxsize=None) def take(self, k: int = 1) -> list\n"
        "    starter: @functools.lru_cache(maxsize=None) def take(self, k: int = 2) -> list"
    ]


FRONT = """\
+++
id = 901
title = "Toy"
chapter = 0
module = "minisgl/toy.py"
symbols = ["add"]
+++
The statement.
"""


def test_front_matter_is_toml_between_plus_lines():
    meta, body = parse_front_matter(FRONT)
    assert meta == {
        "id": 901,
        "title": "Toy",
        "chapter": 0,
        "module": "minisgl/toy.py",
        "symbols": ["add"],
    }
    assert body == "The statement.\n"


@pytest.mark.parametrize(
    "text, message",
    [
        (FRONT.replace("+++", "---"), "must start with a '\\+\\+\\+' line"),
        (FRONT.replace("+++\nThe", "The"), "not closed"),
        (FRONT.replace("chapter = 0", "chapter: 0"), "front matter: Expected '='"),
        (FRONT.replace("symbols", "symbol"), "unknown front matter key 'symbol'"),
        (FRONT.replace("chapter = 0", 'chapter = "7"'), "chapter = '7' is not an integer"),
        (FRONT.replace("chapter = 0", "chapter = true"), "chapter = True is not an integer"),
        (FRONT.replace('["add"]', "[1]"), "symbols = \\[1\\] is not a list of strings"),
        (FRONT.replace('title = "Toy"\n', ""), "lacks title"),
    ],
)
def test_bad_front_matter_is_refused_naming_the_file_and_the_key(text, message):
    with pytest.raises(ValueError, match=f"problem.md.*{message}"):
        parse_front_matter(text)


def test_a_wrong_answer_is_replacements_of_the_engine_module(tmp_path):
    spec = tmp_path / "takes_the_last.toml"
    spec.write_text(
        textwrap.dedent(
            """\
            about = "hands out the last slots"
            expect = "test_take"

            [[replace]]
            old = '''
                    out, self.free = self.free[:k], self.free[k:]
            '''
            new = '''
                    out, self.free = self.free[-k:], self.free[:-k]
            '''
            """
        )
    )
    wrong = broken.load(spec)
    assert (wrong.about, wrong.expect, wrong.verdict) == (
        "hands out the last slots",
        "test_take",
        "Wrong answer",
    )
    assert "self.free[-k:]" in wrong.apply(ENGINE, "minisgl/pool.py")
    with pytest.raises(broken.WrongAnswerError, match="occurs 0 times in minisgl/pool.py"):
        wrong.apply(ENGINE.replace("self.free[:k]", "self.free[0:k]"), "minisgl/pool.py")


@pytest.mark.parametrize(
    "text, message",
    [
        ('about = "x"\n[[replace]]\nold = "a"\nnew = "b"\n', "needs about"),
        ('about = "x"\nexpect = "t"\n', "needs one or more \\[\\[replace\\]\\]"),
        ('about = "x"\nexpect = "t"\nverdict = "Accepted"\n', "a wrong answer must fail"),
        ('about = "x"\nexpect = "t"\nexpected = "t"\n', "unknown keys expected"),
    ],
)
def test_a_malformed_wrong_answer_is_named(tmp_path, text, message):
    (tmp_path / "w.toml").write_text(text)
    with pytest.raises(broken.WrongAnswerError, match=f"broken/w.toml: .*{message}"):
        broken.load(tmp_path / "w.toml")
