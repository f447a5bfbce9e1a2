"""tools/setup.sh: which PyTorch it installs when none imports, as the README says.

setup.sh runs against a stand-in ``python`` that has no torch (or has one) and whose pip only
prints what it would install; PyTorch's CPU index is a local HTTP server that answers, or a
closed port that does not.
"""

from __future__ import annotations

import functools
import http.server
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import ROOT

FAKE_PYTHON = """#!/usr/bin/env bash
# python without torch (unless FAKE_TORCH=1); its pip prints what it would install
case "$*" in
    *"import torch"*) [ "${{FAKE_TORCH:-0}}" = 1 ]; exit ;;
    "-m pip "*) echo "PIP $*"; exit 0 ;;
esac
[ "$1" = "-" ] && exit 1  # setup.sh's "is minisgl installed and up to date?": no
exec {python} "$@"
"""


@pytest.fixture
def fake_python(tmp_path: Path) -> Path:
    path = tmp_path / "python"
    path.write_text(FAKE_PYTHON.format(python=sys.executable))
    path.chmod(0o755)
    return path


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # no request lines in the test output
        pass


@pytest.fixture
def answering_index(tmp_path: Path) -> Iterator[str]:
    """A CPU index on a loopback port that lists torch (what the probe asks for)."""
    (tmp_path / "index" / "torch").mkdir(parents=True)
    (tmp_path / "index" / "torch" / "index.html").write_text("<html></html>")
    handler = functools.partial(QuietHandler, directory=str(tmp_path / "index"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there any more: refused at once


def run_setup(fake_python: Path, index: str, has_torch: bool = False) -> list[str]:
    env = dict(
        os.environ,
        PYTHON=str(fake_python),
        TORCH_CPU_INDEX=index,
        FAKE_TORCH="1" if has_torch else "0",
    )
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "setup.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_without_torch_it_takes_the_cpu_build_when_the_cpu_index_answers(
    fake_python, answering_index
):
    lines = run_setup(fake_python, answering_index)
    assert f"PIP -m pip install torch==2.13.0 --index-url {answering_index}" in lines
    assert any("from PyTorch's CPU index" in line for line in lines)


def test_without_torch_and_no_cpu_index_it_asks_pips_own_indexes_and_says_so(fake_python):
    url = closed_port_url()
    lines = run_setup(fake_python, url)
    assert "PIP -m pip install torch==2.13.0" in lines
    assert any(f"({url}) does not answer" in line for line in lines)
    assert any("the CUDA build" in line for line in lines)


def test_a_torch_that_imports_is_kept(fake_python, answering_index):
    lines = run_setup(fake_python, answering_index, has_torch=True)
    assert not any("torch==" in line for line in lines)
    assert "PIP -m pip install -e .[dev,docs]" in lines
