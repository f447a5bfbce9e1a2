"""Continuous batching: the scheduler and its managers. Mirrors upstream ``minisgl.scheduler``."""

from .config import SchedulerConfig
from .scheduler import Scheduler

__all__ = ["Scheduler", "SchedulerConfig"]
