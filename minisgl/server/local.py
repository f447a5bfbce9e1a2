"""A real server on this machine, for the scripts that drive one: start ``python -m minisgl``
on a free loopback port, wait until it answers, stop it.

Used by the load test (``minisgl/benchmark/serve_load.py``), the benchmarks that serve, and
``tools/diagnostics/tp_compare.py``. The server runs in its own process session, so stopping it
reaches its workers too. Not in upstream (its benchmarks take the URL of a running server).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Sequence, Tuple

import httpx

ROOT = Path(__file__).resolve().parents[2]  # the checkout this minisgl was imported from


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (free when asked, not reserved)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, extra_args: Sequence[str], log: Path) -> Tuple[subprocess.Popen, str]:
    """``python -m minisgl --model MODEL --port P *extra_args``, output to ``log``; returns
    (the process, its base URL). Returns at once: call ``wait_ready`` next. The child imports
    this same ``minisgl`` (its checkout is put first on ``PYTHONPATH``)."""
    port = free_port()
    cmd = [sys.executable, "-m", "minisgl", "--model", model, "--port", str(port), *extra_args]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(url: str, proc: subprocess.Popen | None, log: Path | None, timeout: float) -> Dict:
    """Poll ``GET /health`` until it answers 200; returns its JSON.

    Raises:
        SystemExit: when ``proc`` exits first (with the end of ``log``), or after ``timeout`` s.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log else ""
            raise SystemExit(f"the server exited with {proc.returncode}:\n{tail}")
        try:
            r = httpx.get(f"{url}/health", timeout=2)
            if r.status_code == 200:
                return r.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server at {url} was not ready in {timeout:.0f} s")


def stop_server(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 60) -> None:
    """Send ``sig`` to the server's process group; SIGKILL it if it has not exited in ``timeout`` s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
