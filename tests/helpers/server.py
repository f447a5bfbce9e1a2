"""A real ``python -m minisgl`` for the server tests (chapter 15), in its own process group.

``Server(model, log, *extra)`` starts one on a free loopback port; ``wait_ready`` waits for
``/health`` and reads the workers' PIDs from the launcher's log line (no response carries
them); ``stop`` signals it (the group: "Ctrl-C in its terminal") and returns its exit status.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest
import torch

from .models import DEVICE, ROOT

MAX_SEQ_LEN = 512


def offline_llm(model_path: Path):
    """The offline engine with the test server's settings (float32, torch attention,
    ``MAX_SEQ_LEN``): the oracle the server's texts are compared with."""
    from minisgl.llm import LLM  # here: the helpers reach step trees that predate it

    return LLM(
        str(model_path),
        dtype=torch.float32,
        device=DEVICE,
        attention_backend="torch",
        max_seq_len_override=MAX_SEQ_LEN,
        num_page_override=8192,
        max_running_req=8,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m minisgl`` in its own process group (so a test can press "Ctrl-C")."""

    def __init__(self, model: Path, log: Path, *extra: str, small: bool = True) -> None:
        """``small``: a context of ``MAX_SEQ_LEN`` tokens and 8,192 KV pages; otherwise the
        server's defaults (the model's context, the device's default pool)."""
        self.port, self.log = free_port(), log
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "minisgl", "--model", str(model), "--port", str(self.port)]
        cmd += ["--device", DEVICE]
        if small:
            cmd += ["--max-seq-len", str(MAX_SEQ_LEN), "--num-pages", "8192"]
        cmd += extra
        kept = filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))  # --target installs
        path = os.pathsep.join([str(ROOT), *kept])
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 600) -> "Server":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"the server exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    line = re.search(r"^workers: (.*)$", self.log.read_text(), re.M)
                    assert line, self.log.read_text()[-2000:]
                    self.workers = {
                        name: psutil.Process(int(pid))
                        for name, pid in re.findall(r"(\S+) \(pid (\d+)\)", line.group(1))
                    }
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.proc.kill()
        pytest.fail(f"the server was not ready in {timeout:.0f} s:\n{self.log.read_text()[-3000:]}")

    def get(self, path: str) -> dict:
        return httpx.get(f"{self.url}{path}", timeout=30).json()

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120
        )

    def output(self) -> str:
        return self.log.read_text()

    def stop(self, sig: int = signal.SIGTERM, group: bool = False) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig) if group else self.proc.send_signal(sig)
        try:
            return self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)


def wait_until_idle(server: Server, timeout: float = 30) -> dict:
    """The scheduler's counters once nothing runs any more."""
    deadline = time.monotonic() + timeout
    while True:
        stats = server.get("/stats")
        if stats["running_reqs"] == stats["pending_reqs"] == stats["open_requests"] == 0:
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.2)
