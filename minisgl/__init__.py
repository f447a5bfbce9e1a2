"""mini-sglang from Scratch: a small LLM serving engine, rebuilt one chapter at a time.

The package mirrors upstream mini-sglang's ``python/minisgl`` layout: ``core`` holds the
request and batch dataclasses, ``layers`` and ``models`` the network, ``kvcache`` and
``attention`` the paged KV cache, ``engine`` one forward pass, ``scheduler`` and ``llm``
the continuous-batching loop and its offline interface.
"""

__version__ = "0.1.0"
