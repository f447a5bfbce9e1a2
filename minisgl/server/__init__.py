"""The OpenAI-compatible server and the launcher of its processes (chapter 15).

Mirrors upstream ``minisgl.server``.
"""

from .args import ServerArgs, parse_args
from .launch import launch_server

__all__ = ["ServerArgs", "launch_server", "parse_args"]
