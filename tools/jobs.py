"""Run independent jobs N at a time; hand their results back in the order they were given.

Shared by ``python -m tools.steps check --jobs``, ``python -m tools.outputs --jobs`` and
``python practice/judge.py check --jobs``. Each job's real work happens in child processes (an
example, a pytest run). Two torch processes with several OpenMP threads apiece on a small
machine spin-wait into each other (10-100x slower), so while more than one job runs, every
child gets one thread (``OMP_NUM_THREADS=1``) unless the caller's environment already says
how many.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence, Tuple

__all__ = ["in_order", "one_thread_per_child"]

Call = Tuple[Callable[..., Any], tuple]


@contextmanager
def one_thread_per_child(jobs: int) -> Iterator[None]:
    """With ``jobs > 1``, set ``OMP_NUM_THREADS=1`` in ``os.environ`` (the children inherit
    it) unless it is set already; put the environment back on exit."""
    if jobs <= 1 or "OMP_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("OMP_NUM_THREADS", None)


def in_order(calls: Sequence[Call], jobs: int, processes: bool = False) -> Iterator[Any]:
    """Yield ``fn(*args)`` for each ``(fn, args)`` of ``calls``, in that order, each as soon
    as it and every call before it are done. Up to ``jobs`` run at once.

    ``jobs <= 1`` runs them one after the other in this process, each only when the
    previous result has been consumed (so a caller that prints as it goes still streams).
    ``processes``: run them in worker processes (started fresh, ``spawn``), for work that
    would not be safe in threads (``subprocess`` with a ``preexec_fn``, ``sys.stdout``
    redirected); ``fn`` and ``args`` must then be picklable (``fn`` a module-level function).
    An exception raised by a call is raised here, when its turn comes.
    """
    if jobs <= 1:
        for fn, args in calls:
            yield fn(*args)
        return
    pool: Executor
    if processes:
        pool = ProcessPoolExecutor(
            max_workers=jobs, mp_context=multiprocessing.get_context("spawn")
        )
    else:
        pool = ThreadPoolExecutor(max_workers=jobs)
    with one_thread_per_child(jobs), pool:
        futures = [pool.submit(fn, *args) for fn, args in calls]
        try:
            for fut in futures:
                yield fut.result()
        finally:
            for fut in futures:  # an error (or the caller stopping early): start no more
                fut.cancel()
