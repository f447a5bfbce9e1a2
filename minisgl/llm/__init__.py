"""The offline interface. Mirrors upstream ``minisgl.llm``."""

from .llm import LLM, RequestAllFinished

__all__ = ["LLM", "RequestAllFinished"]
