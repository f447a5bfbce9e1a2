"""``python -m minisgl --model PATH [--port N] [--host H] [--device cpu|cuda] [--shell]``.

Starts the API server (or, with ``--shell``, a chat in this terminal), the tokenizer
worker and the scheduler; Ctrl-C or SIGTERM stops all of them. Mirrors upstream
``minisgl.__main__``.
"""

import os
import sys

from minisgl.server.launch import launch_server

if __name__ == "__main__":
    launch_server()
    # everything is stopped: skip the interpreter's slow teardown of torch
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
