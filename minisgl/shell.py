"""``python -m minisgl --model PATH --shell``: chat with the model in this terminal.

The same processes as the server, minus HTTP: this process talks to the tokenizer worker
through a ``FrontendManager`` directly and prints each reply as it streams in. ``/reset``
starts a new conversation, ``/exit`` (or Ctrl-D) leaves. Answers are greedy, so the same
question gives the same answer. Mirrors upstream ``minisgl.shell`` (which uses
prompt_toolkit; plain ``input`` here).
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List

from minisgl.core import SamplingParams
from minisgl.server.args import ServerArgs
from minisgl.server.frontend import FrontendManager

MAX_ANSWER_TOKENS = 512


async def _chat(fm: FrontendManager) -> None:
    loop = asyncio.get_running_loop()
    history: List[Dict[str, str]] = []
    print("chat with the model: /reset starts over, /exit (or Ctrl-D) leaves", flush=True)
    while True:
        try:
            line = (await loop.run_in_executor(None, input, "> ")).strip()
        except EOFError:
            print()
            return
        if not line:
            continue
        if line == "/exit":
            return
        if line == "/reset":
            history = []
            print("(new conversation)", flush=True)
            continue
        history.append({"role": "user", "content": line})
        params = SamplingParams(max_tokens=min(MAX_ANSWER_TOKENS, fm.max_seq_len - 1))
        uid = await fm.submit(list(history), params)
        answer: List[str] = []
        async for reply in fm.replies(uid):
            if reply.error is not None:
                print(f"[error: {reply.error}] (try /reset)", flush=True)
                history.pop()
                break
            answer.append(reply.incremental_output)
            print(reply.incremental_output, end="", flush=True)
        else:
            print(flush=True)
            history.append({"role": "assistant", "content": "".join(answer)})


def run_shell(args: ServerArgs, workers: List[Any], info: Dict[str, Any]) -> None:
    """Chat until ``/exit`` or end of input; the caller stops the workers."""

    async def main() -> None:
        fm = FrontendManager(args, workers, int(info["max_seq_len"]))
        await fm.start()
        try:
            await _chat(fm)
        finally:
            fm.stop()

    asyncio.run(main())
