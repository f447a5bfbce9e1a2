"""``python -m minisgl --model PATH [--port N] [--host H] [--device cpu|cuda] [--shell]``.

Starts the API server (or, with ``--shell``, a chat in this terminal), the tokenizer
worker and the scheduler; Ctrl-C or SIGTERM stops all of them. Mirrors upstream
``minisgl.__main__``.
"""

import os
import sys

from minisgl.server.launch import launch_server

if __name__ == "__main__":
    code = 0
    try:
        launch_server()
    except SystemExit as e:  # bad arguments, or a worker died: one line, status 1
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else 1
    # everything is stopped: skip the interpreter's slow teardown of torch
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
