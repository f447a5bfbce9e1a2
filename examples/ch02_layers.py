"""Chapter 2: the layers, one property each.

Three facts the engine relies on, shown with random tensors (no model needed):
merged projections compute the same numbers as separate ones; RMSNorm rescales each
token to unit root-mean-square; RoPE makes a query-key score depend only on distance.
"""

import torch
import torch.nn.functional as F

from minisgl.layers import LinearQKVMerged, OPList, RMSNorm, RotaryEmbedding

torch.manual_seed(0)
hidden, head_dim, num_q, num_kv = 64, 16, 4, 2
x = torch.randn(5, hidden)  # T = 5 tokens

# 1. One matmul for q, k and v
wq = torch.randn(num_q * head_dim, hidden)
wk = torch.randn(num_kv * head_dim, hidden)
wv = torch.randn(num_kv * head_dim, hidden)
qkv_proj = LinearQKVMerged(hidden, head_dim, num_q, num_kv, has_bias=False)
qkv_proj.weight = torch.cat([wq, wk, wv])  # what the loader does with the checkpoint
q, k, v = qkv_proj.forward(x).split(
    [num_q * head_dim, num_kv * head_dim, num_kv * head_dim], dim=-1
)
print(
    f"merged qkv weight {tuple(qkv_proj.weight.shape)}: x [T, hidden] -> q {tuple(q.shape)}, "
    f"k {tuple(k.shape)}, v {tuple(v.shape)}"
)
diff = max(
    (q - F.linear(x, wq)).abs().max(),
    (k - F.linear(x, wk)).abs().max(),
    (v - F.linear(x, wv)).abs().max(),
)
print(f"  max |merged - separate| = {float(diff):.1e}")

# 2. RMSNorm
norm = RMSNorm(hidden, eps=1e-6)
norm.weight = torch.ones(hidden)
y = norm.forward(x * 100)
print(
    f"RMSNorm: rms of each token before {[round(float(r), 1) for r in (x * 100).pow(2).mean(-1).sqrt()]}"
)
print(f"                          after  {[round(float(r), 3) for r in y.pow(2).mean(-1).sqrt()]}")

# 3. RoPE: the score of query at m and key at n depends on m - n only
rope = RotaryEmbedding(head_dim, head_dim, max_position=4096, base=10000.0)
q1, k1 = torch.randn(1, 1, head_dim), torch.randn(1, 1, head_dim)


def score(m: int, n: int) -> float:
    qm, _ = rope.forward(torch.tensor([m]), q1, k1)
    _, kn = rope.forward(torch.tensor([n]), q1, k1)
    return float((qm * kn).sum())


print("RoPE score of a fixed (q, k) pair:")
for m, n in [(5, 2), (105, 102), (3005, 3002), (5, 4)]:
    print(f"  q at {m:>4}, k at {n:>4} (distance {m - n}): {score(m, n):+.4f}")

# 4. Weights are named by attribute path, like the checkpoint
stack = OPList([RMSNorm(4, 1e-6), RMSNorm(4, 1e-6)])
print(f"an OPList of two norms has weights {sorted(stack.state_dict())}")
