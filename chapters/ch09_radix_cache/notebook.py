# The cells of chapter 9's notebook that run each part on the real radix cache, with token ids
# written by hand (tools/notebook_parts.py puts each after the section its `part` names).

# %% part="Nodes and handles"
# An empty tree: only the root, which is never evicted.
import torch

from minisgl.kvcache.radix_cache import RadixPrefixCache


def ids(*tokens: int) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.int32)


def show(tree: RadixPrefixCache, node=None, depth: int = 0) -> None:
    """Print the tree: each edge's token ids, their KV slots, and its reference count."""
    node = node or tree.root
    for child in node.children.values():
        print(
            "  " * depth + f"{child.key.tolist()} at {child.value.tolist()} refs={child.ref_count}"
        )
        show(tree, child, depth + 1)


tree = RadixPrefixCache(device=torch.device("cpu"), page_size=1)
print("root children:", tree.root.children, "size:", tree.size_info)

# %% part="Lookup and insertion"
# Insert two prompts that share [1, 2, 3]: the second insertion splits the first edge.
tree.insert_prefix(ids(1, 2, 3, 4, 5), ids(10, 11, 12, 13, 14))
result = tree.insert_prefix(ids(1, 2, 3, 7), ids(20, 21, 22, 23))
print("already cached when inserting the second:", result.cached_len, "tokens")
show(tree)
match = tree.match_prefix(ids(1, 2, 3, 7, 9)).cuda_handle
print(
    "match of [1, 2, 3, 7, 9]:", match.cached_len, "tokens at", match.get_matched_indices().tolist()
)

# %% part="Reference counts"
# A running request locks its match: the path to the root is protected, not evictable.
tree.lock_handle(match)
print(tree.size_info)
show(tree)

# %% part="Eviction"
# Only the unlocked leaf [4, 5] can go; it is evicted first, and asking for more fails.
print("evicted slots:", tree.evict(2).tolist())
try:
    tree.evict(1)
except RuntimeError as err:
    print("RuntimeError:", err)
tree.lock_handle(match, unlock=True)
print("unlocked:", tree.size_info)

# %% part="Checking the tree"
tree.check_integrity()
print("integrity holds; now break a node on purpose:")
next(iter(tree.root.children.values())).ref_count = 5
try:
    tree.check_integrity()
except RuntimeError as err:
    print("RuntimeError:", err)

# %% part="Walking the tree in whole pages"
# With P = 2 only whole pages are cached: 5 tokens insert as 4, and a match stops at a page.
paged = RadixPrefixCache(device=torch.device("cpu"), page_size=2)
paged.insert_prefix(ids(1, 2, 3, 4, 5), ids(10, 11, 12, 13, 14))
show(paged)
print("match of [1, 2, 3, 9]:", paged.match_prefix(ids(1, 2, 3, 9)).cuda_handle.cached_len)
