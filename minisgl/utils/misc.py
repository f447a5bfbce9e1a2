"""Small integer helpers used for page arithmetic and sharding."""

from __future__ import annotations


def div_ceil(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative integers, e.g. tokens -> pages."""
    return (a + b - 1) // b


def align_up(a: int, b: int) -> int:
    """The smallest multiple of ``b`` that is >= ``a``."""
    return div_ceil(a, b) * b


def div_even(a: int, b: int, allow_replicate: bool = False) -> int:
    """``a / b`` when it divides evenly, e.g. heads per tensor-parallel rank.

    With ``allow_replicate``, ``a < b`` is accepted and returns 1: each of ``a`` heads is
    then replicated on ``b / a`` ranks (KV heads under tensor parallelism).

    Raises:
        ValueError: when ``a`` is not divisible by ``b`` (or ``b`` by ``a`` when replicating).
    """
    if allow_replicate and a < b:
        if b % a != 0:
            raise ValueError(f"cannot replicate {a} heads evenly over {b} ranks")
        return 1
    if a % b != 0:
        raise ValueError(f"{a} is not divisible by {b}")
    return a // b
