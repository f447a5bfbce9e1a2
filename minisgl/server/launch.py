"""Starting and stopping the server's processes.

``python -m minisgl`` runs ``launch_server``: this process becomes the API server (or the
shell), and it starts, with ``multiprocessing`` in "spawn" mode (a fresh interpreter: no
forked CUDA or thread state), one scheduler process per tensor-parallel rank and one
tokenizer worker. Each worker reports on a queue once it is ready (the scheduler also
reports its context limit); the API opens only when all have. A worker that dies during
start-up stops the launch with its name and exit code.

A worker that dies while serving stops the server (``run_api_server`` returns why), and
``launch_server`` exits with one line naming the worker and its exit code, after reaping
the others. The workers' PIDs are printed once at start-up, for the operator's log; no
response carries them.

Shutting down: Ctrl-C reaches every process of the terminal's process group, but the
workers ignore it; SIGTERM reaches only this one. Either way this process stops serving
first, then terminates the workers it started, waits for them, and removes the launch's
socket directory, so a worker that ends during shutdown is not mistaken for a crash. Workers also ask the kernel to send them
SIGTERM if this process dies first (Linux ``PR_SET_PDEATHSIG``), so none is orphaned.
Mirrors upstream ``minisgl.server.launch``.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import multiprocessing.util
import os
import queue
import shutil
import signal
import sys
import time
from dataclasses import replace
from typing import Any, Dict, List

from minisgl.distributed import DistributedInfo
from minisgl.utils import init_logger
from minisgl.utils.mp import new_ipc_dir

from .args import ServerArgs, parse_args, preflight
from .worker import Worker

logger = init_logger("minisgl.server.launch")
STARTUP_TIMEOUT_S = 600.0  # loading a large checkpoint, or compiling kernels on first use
STOP_TIMEOUT_S = 15.0


def _interrupt(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: let the clean-up finish
    raise KeyboardInterrupt


def _become_worker() -> None:
    """In a new worker: die with the parent, ignore Ctrl-C (the parent stops it, in order),
    and treat SIGTERM as the request for a clean exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.signal(signal.SIGTERM, _interrupt)


def _exit_now() -> None:
    """Leave without the interpreter's teardown: after ``import torch`` it can take
    seconds, and everything that matters (sockets) is already closed. Only the named
    semaphores that ``multiprocessing`` would release at exit (tqdm's lock) are released
    first. Exceptions do not get here: they exit normally, with their traceback."""
    multiprocessing.util._exit_function()  # type: ignore[attr-defined]
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _scheduler_main(args: ServerArgs, ack: "mp.Queue[Dict[str, Any]]") -> None:
    _become_worker()
    import torch

    from minisgl.scheduler import Scheduler

    scheduler = recorder = None
    try:
        scheduler = Scheduler(args)
        if args.trace_path and args.tp_info.rank == 0:  # opt-in; without it nothing is wrapped
            from minisgl.scheduler.trace import TraceRecorder

            recorder = TraceRecorder.attach(scheduler)
        engine = scheduler.engine
        ack.put(
            {
                "name": f"scheduler-{args.tp_info.rank}",
                "max_seq_len": engine.max_seq_len,
                "kv_tokens": engine.num_pages * engine.config.page_size,
            }
        )
        with torch.inference_mode():
            scheduler.run_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if recorder is not None:
            recorder.save(
                args.trace_path, run="this server's whole run", source="python -m minisgl"
            )
        if scheduler is not None:
            scheduler.stop_io()
    _exit_now()


def _tokenizer_main(args: ServerArgs, ack: "mp.Queue[Dict[str, Any]]") -> None:
    _become_worker()
    from minisgl.tokenizer import TokenizerWorker

    worker = None
    try:
        worker = TokenizerWorker(
            args.model_path,
            args.zmq_detokenizer_addr,
            args.zmq_backend_addr,
            args.zmq_frontend_addr,
        )
        ack.put(
            {
                "name": "tokenizer",
                "max_token_bytes": worker.max_token_bytes,
                "min_message_tokens": worker.min_message_tokens,
            }
        )
        worker.run()
    except KeyboardInterrupt:
        pass
    finally:
        if worker is not None:
            worker.stop()
    _exit_now()


def start_workers(args: ServerArgs) -> tuple[List[Worker], Dict[str, Any]]:
    """Start the scheduler rank(s) and the tokenizer worker; return them once all are
    ready, with what they reported merged (``max_seq_len``).

    Raises:
        RuntimeError: naming the worker, when one exits before it is ready.
        TimeoutError: after ``STARTUP_TIMEOUT_S`` seconds.
    """
    ctx = mp.get_context("spawn")
    ack: "mp.Queue[Dict[str, Any]]" = ctx.Queue()
    workers: List[Worker] = []
    size = args.tp_info.size
    for rank in range(size):
        rank_args = replace(args, tp_info=DistributedInfo(rank, size))
        name = f"minisgl-scheduler-{rank}"
        workers.append(
            Worker(
                name,
                ctx.Process(target=_scheduler_main, args=(rank_args, ack), name=name, daemon=True),
            )
        )
    name = "minisgl-tokenizer"
    workers.append(
        Worker(name, ctx.Process(target=_tokenizer_main, args=(args, ack), name=name, daemon=True))
    )
    info: Dict[str, Any] = {}
    try:
        for w in workers:
            w.process.start()
        expected, deadline = 2, time.monotonic() + STARTUP_TIMEOUT_S  # rank 0 and the tokenizer ack
        if size > 1:
            expected += size - 1
        while expected > 0:
            try:
                info.update(ack.get(timeout=0.2))
                expected -= 1
                continue
            except queue.Empty:
                pass
            for w in workers:
                if w.process.exitcode is not None:
                    raise RuntimeError(
                        f"worker {w.describe()} exited with code {w.process.exitcode} while starting"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers not ready after {STARTUP_TIMEOUT_S:.0f} s")
    except BaseException:
        stop_workers(workers)
        raise
    finally:
        ack.close()  # its semaphores are released now: the process may end with os._exit
        ack.join_thread()
    info.pop("name", None)
    return workers, info


def stop_workers(workers: List[Worker]) -> None:
    """SIGTERM every live worker, wait up to ``STOP_TIMEOUT_S``, then SIGKILL stragglers."""
    for w in workers:
        if w.process.pid is not None and w.process.exitcode is None:
            w.process.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for w in workers:
        if w.process.pid is None:
            continue
        w.process.join(max(0.0, deadline - time.monotonic()))
        if w.process.exitcode is None:
            logger.warning(
                f"worker {w.describe()} did not stop in {STOP_TIMEOUT_S:.0f} s: killing it"
            )
            w.process.kill()
            w.process.join()


def launch_server(argv: List[str] | None = None) -> None:
    """Parse the command line, start the workers, serve (or chat) until interrupted, and
    stop everything. Returns normally after Ctrl-C or SIGTERM.

    Raises:
        SystemExit: with one line, for bad arguments or a worker that died while serving.
    """
    ipc_dir = new_ipc_dir()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    workers: List[Worker] = []
    dead: Worker | None = None  # the worker whose death stopped the server
    try:
        args = parse_args(argv, ipc_dir)
        problem = preflight(args)
        if problem:
            raise SystemExit(f"python -m minisgl: error: {problem}")
        print(f"starting the workers for {args.model_path} on {args.device} ...", flush=True)
        workers, info = start_workers(args)
        print("workers: " + ", ".join(w.describe() for w in workers), flush=True)
        if args.shell:
            from minisgl.shell import run_shell

            run_shell(args, workers, info)
        else:
            from .api_server import run_api_server

            dead = run_api_server(args, workers, info)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(
            signal.SIGTERM, signal.SIG_IGN
        )  # a second SIGTERM must not cut the clean-up short
        stop_workers(workers)
        shutil.rmtree(ipc_dir, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)
    if dead is not None:  # reaped by now, so its exit code is known; exit status 1, on stderr
        raise SystemExit(
            f"python -m minisgl: error: worker {dead.name} died ({dead.exit_text()}); "
            "the server stopped"
        )
