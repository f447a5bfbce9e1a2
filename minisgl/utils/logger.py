"""Logging with a ``rank0`` flavour: under tensor parallelism only rank 0 should speak."""

from __future__ import annotations

import logging
import os
from typing import Any


class RankLogger(logging.LoggerAdapter):
    """A logger whose ``*_rank0`` methods are silent on ranks other than 0."""

    def _is_rank0(self) -> bool:
        from minisgl.distributed import get_tp_info

        return get_tp_info().rank == 0

    def info_rank0(self, msg: str, *args: Any) -> None:
        if self._is_rank0():
            self.info(msg, *args)

    def warning_rank0(self, msg: str, *args: Any) -> None:
        if self._is_rank0():
            self.warning(msg, *args)

    def debug_rank0(self, msg: str, *args: Any) -> None:
        if self._is_rank0():
            self.debug(msg, *args)


def init_logger(name: str) -> RankLogger:
    """A logger for module ``name``; level from ``MINISGL_LOG_LEVEL`` (default INFO: start-up
    facts such as the KV pool size are printed)."""
    root = logging.getLogger("minisgl")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(
            logging.Formatter(
                "[%(asctime)s %(levelname)s %(name)s] %(message)s", datefmt="%H:%M:%S"
            )
        )
        root.addHandler(handler)
        root.setLevel(os.environ.get("MINISGL_LOG_LEVEL", "INFO").upper())
        root.propagate = False
    return RankLogger(
        logging.getLogger(name if name.startswith("minisgl") else f"minisgl.{name}"), {}
    )
