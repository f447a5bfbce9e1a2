"""One forward pass over a prepared batch. Mirrors upstream ``minisgl.engine``."""

from .config import EngineConfig
from .engine import Engine, ForwardOutput
from .sample import BatchSamplingArgs, Sampler

__all__ = ["BatchSamplingArgs", "Engine", "EngineConfig", "ForwardOutput", "Sampler"]
