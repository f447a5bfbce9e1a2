"""The radix prefix cache: a tree of token sequences whose KV stays in the pool.

Requests that share a prefix (a system prompt, a few-shot header, earlier turns of a
chat) walk the same path from the root; whatever path exists is KV that need not be
computed again. Edges hold whole pages of ``P`` tokens, because KV is allocated a page at
a time. A node in use by a running request is *locked* (reference count > 0) and cannot
be evicted; unlocked leaves are evicted least-recently-used first when pages run out.

Mirrors upstream ``minisgl.kvcache.radix_cache`` (the idea is SGLang's RadixAttention).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Dict, Iterator, List, Tuple

import torch

from . import PREFIX_CACHES
from .base import BaseCacheHandle, BasePrefixCache, InsertResult, MatchResult, SizeInfo

_clock = itertools.count()  # a logical clock for LRU: strictly increasing, no ties


class RadixTreeNode:
    """An edge of the tree: ``key`` token ids ``[n]`` (CPU) stored at slots ``value`` ``[n]``."""

    def __init__(
        self, key: torch.Tensor, value: torch.Tensor, parent: "RadixTreeNode | None"
    ) -> None:
        self.key = key
        self.value = value
        self.parent = parent
        self.children: Dict[Tuple[int, ...], RadixTreeNode] = {}
        self.ref_count = 0
        self.last_access = next(_clock)

    @property
    def length(self) -> int:
        return len(self.key)

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def touch(self) -> None:
        self.last_access = next(_clock)


@dataclass(frozen=True)
class RadixCacheHandle(BaseCacheHandle):
    node: RadixTreeNode

    def get_matched_indices(self) -> torch.Tensor:
        parts: List[torch.Tensor] = []
        node: RadixTreeNode | None = self.node
        while node is not None and node.parent is not None:
            parts.append(node.value)
            node = node.parent
        if not parts:
            return self.node.value  # the root's empty tensor
        return torch.cat(parts[::-1])


class RadixPrefixCache(BasePrefixCache):
    """Sizes are in tokens; every cached length is a multiple of ``page_size``."""

    def __init__(self, device: torch.device, page_size: int = 1) -> None:
        self.device = device
        self.page_size = page_size
        self.reset()

    def reset(self) -> None:
        empty_key = torch.empty(0, dtype=torch.int32)
        self.root = RadixTreeNode(
            empty_key, torch.empty(0, dtype=torch.int32, device=self.device), None
        )
        self.root.ref_count = 1  # the root is never evicted
        self._evictable = 0
        self._protected = 0

    # ---- lookups ----------------------------------------------------------------------
    def _edge(self, ids: torch.Tensor) -> Tuple[int, ...]:
        return tuple(ids[: self.page_size].tolist())

    def _common_len(self, a: torch.Tensor, b: torch.Tensor) -> int:
        """Length of the common prefix of ``a`` and ``b``, rounded down to whole pages."""
        n = min(len(a), len(b))
        diff = (a[:n] != b[:n]).nonzero()
        common = int(diff[0]) if len(diff) else n
        return common // self.page_size * self.page_size

    def _walk(self, ids: torch.Tensor) -> Tuple[RadixTreeNode, int]:
        """Follow ``ids`` down the tree; returns the deepest node matched and the length.

        A partially matched edge is split so that the match ends exactly at a node.
        """
        node, pos = self.root, 0
        while len(ids) - pos >= self.page_size:
            child = node.children.get(self._edge(ids[pos:]))
            if child is None:
                break
            child.touch()
            n = self._common_len(child.key, ids[pos:])
            if n < child.length:
                child = self._split(child, n)
            node, pos = child, pos + n
            if n < node.length:  # defensive: unreachable after the split
                break
        return node, pos

    def _split(self, node: RadixTreeNode, n: int) -> RadixTreeNode:
        """Cut ``node``'s edge after ``n`` tokens; returns the new upper node."""
        assert node.parent is not None and 0 < n < node.length
        upper = RadixTreeNode(node.key[:n], node.value[:n], node.parent)
        upper.ref_count = node.ref_count  # every lock through node also passes through upper
        upper.last_access = node.last_access
        node.parent.children[self._edge(node.key)] = upper
        node.key, node.value, node.parent = node.key[n:], node.value[n:], upper
        upper.children[self._edge(node.key)] = node
        return upper

    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        """Longest cached, page-aligned prefix of ``input_ids: [N]``.

        The cached content does not change (an edge may be split in two). The returned
        slots are only safe to use once the handle is locked.
        """
        node, length = self._walk(input_ids.cpu())
        return MatchResult(RadixCacheHandle(cached_len=length, node=node))

    # ---- updates ----------------------------------------------------------------------
    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> InsertResult:
        """Cache the page-aligned part of ``input_ids: [N]`` whose KV is at ``indices: [N]``.

        Returns how much was cached already (the caller frees those duplicate slots) and a
        handle to the whole inserted prefix.
        """
        length = len(input_ids) // self.page_size * self.page_size
        ids = input_ids[:length].cpu()
        node, pos = self._walk(ids)
        if pos < length:
            leaf = RadixTreeNode(ids[pos:].clone(), indices[pos:length].clone(), node)
            node.children[self._edge(leaf.key)] = leaf
            self._evictable += leaf.length
            node = leaf
        return InsertResult(pos, RadixCacheHandle(cached_len=length, node=node))

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        assert isinstance(handle, RadixCacheHandle)
        node: RadixTreeNode | None = handle.node
        while node is not None and node is not self.root:
            if unlock:
                assert node.ref_count > 0, "unlocking a node that is not locked"
                node.ref_count -= 1
                if node.ref_count == 0:
                    self._protected -= node.length
                    self._evictable += node.length
            else:
                if node.ref_count == 0:
                    self._evictable -= node.length
                    self._protected += node.length
                node.ref_count += 1
            node = node.parent

    def evict(self, size: int) -> torch.Tensor:
        """Evict least-recently-used unlocked leaves until at least ``size`` tokens are freed.

        Raises:
            RuntimeError: when fewer than ``size`` tokens are evictable.
        """
        if size <= 0:
            return self.root.value
        if size > self._evictable:
            raise RuntimeError(f"cannot evict {size} tokens: only {self._evictable} are evictable")
        heap = [(n.last_access, id(n), n) for n in self._nodes() if n.is_leaf and n.ref_count == 0]
        heapq.heapify(heap)
        freed: List[torch.Tensor] = []
        total = 0
        while total < size:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[self._edge(leaf.key)]
            freed.append(leaf.value)
            total += leaf.length
            self._evictable -= leaf.length
            if parent is not self.root and parent.is_leaf and parent.ref_count == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return torch.cat(freed)

    # ---- bookkeeping ------------------------------------------------------------------
    def _nodes(self) -> Iterator[RadixTreeNode]:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(evictable_size=self._evictable, protected_size=self._protected)

    def check_integrity(self) -> None:
        evictable = protected = 0
        for node in self._nodes():
            if node.length == 0 or node.length % self.page_size:
                raise RuntimeError(f"radix node of length {node.length} is not page-aligned")
            if len(node.value) != node.length:
                raise RuntimeError("radix node key and value lengths differ")
            child_refs = sum(c.ref_count for c in node.children.values())
            if node.ref_count < child_refs:
                raise RuntimeError("a radix node has fewer references than its children")
            if node.ref_count:
                protected += node.length
            else:
                evictable += node.length
        if (evictable, protected) != (self._evictable, self._protected):
            raise RuntimeError(
                f"radix sizes drifted: counted evictable={evictable} protected={protected}, "
                f"tracked evictable={self._evictable} protected={self._protected}"
            )


@PREFIX_CACHES.register("radix")
def _radix(device: torch.device, page_size: int) -> BasePrefixCache:
    return RadixPrefixCache(device, page_size)
