"""Chapter 4: where the KV cache lives, and how a request finds its part of it.

One pool tensor holds every layer's keys and values, cut into pages of P token slots.
A request owns a row of the page table: entry [row, pos] is the slot of its token pos.
This script builds a small pool for SmolLM2's shape, gives two requests scattered pages,
stores fake keys through the page table and reads them back.
"""

import torch

from minisgl.kvcache import MHAKVCache, create_prefix_cache
from minisgl.scheduler.table import TableManager

layers, kv_heads, head_dim, page_size, num_pages = 30, 3, 64, 4, 16
pool = MHAKVCache(
    kv_heads, layers, head_dim, num_pages, page_size, torch.float32, torch.device("cpu")
)
print(
    f"pool [2, L, pages, P, H_kv, D] = {tuple(pool._kv_buffer.shape)}: {pool.num_slots} token slots, "
    f"{pool._kv_buffer.numel() * 4 / 2**20:.1f} MiB"
)
print(
    f"one token of KV over all layers: 2 * {layers} * {kv_heads} * {head_dim} * 4 bytes = "
    f"{2 * layers * kv_heads * head_dim * 4 / 1024:.1f} KiB"
)

page_table = torch.zeros((4, 32), dtype=torch.int32)  # a row for each of 4 requests
tables = TableManager(max_running_reqs=4, page_table=page_table)
a, b = tables.allocate(), tables.allocate()
print(f"rows handed out: a={a}, b={b}; {tables.available_size} left")

# request a: 6 tokens on pages 5 and 2; request b: 3 tokens on page 9
for row, pages, length in [(a, [5, 2], 6), (b, [9], 3)]:
    slots = torch.cat([torch.arange(p * page_size, (p + 1) * page_size) for p in pages])[:length]
    page_table[row, :length] = slots.to(torch.int32)
    print(f"row {row}: pages {pages} -> slots {page_table[row, :length].tolist()}")

layer = 0
for row, length in [(a, 6), (b, 3)]:
    out_loc = page_table[row, :length]
    k = torch.full((length, kv_heads, head_dim), float(row + 1)) * torch.arange(1, length + 1).view(
        -1, 1, 1
    )
    pool.store_kv(k, k.clone(), out_loc, layer)
read_back = pool.k_slots(layer)[page_table[a, :6]][:, 0, 0]
print(f"keys of row {a} read back through the page table: {read_back.tolist()}")
print(f"page 5 of layer 0 holds: {pool.k_cache(layer)[5, :, 0, 0].tolist()}")
print(f"page 9 (request b, 3 of 4 slots used): {pool.k_cache(layer)[9, :, 0, 0].tolist()}")

naive = create_prefix_cache(torch.device("cpu"), "naive")
match = naive.match_prefix(torch.tensor([1, 2, 3]))
print(
    f"naive prefix cache: match of any prompt -> cached_len={match.cuda_handle.cached_len}, "
    f"holds {naive.size_info.total_size} tokens"
)
tables.free(a)
tables.free(b)
print(f"rows returned: {tables.available_size} free")
