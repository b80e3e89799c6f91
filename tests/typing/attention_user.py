"""A user's own attention code: the library's functions and modules give mypy their real types."""

import warnings
from typing import assert_type

import torch
from torch import Tensor

import typed_transformer as tt

q = torch.randn(2, 4, 5, 8)
k = torch.randn(2, 2, 7, 8)
v = torch.randn(2, 2, 7, 8)

# The output alone: a Tensor, not a union with the deprecated flag's tuple (out.transpose needs no narrowing).
out = tt.scaled_dot_product_attention(q, k, v, is_causal=True)
assert_type(out, Tensor)
merged = out.transpose(1, 2).flatten(2)
assert_type(merged, Tensor)
assert_type(tt.scaled_dot_product_attention(q, k, v, backend="sdpa"), Tensor)
assert_type(tt.scaled_dot_product_attention(q, k, v, return_weights=False), Tensor)

# The weights come from their own function, with an exact pair type.
pair = tt.scaled_dot_product_attention_with_weights(q, k, v)
assert_type(pair, tuple[Tensor, Tensor])

# The deprecated flag, still typed exactly where its value is known.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    assert_type(tt.scaled_dot_product_attention(q, k, v, return_weights=True), tuple[Tensor, Tensor])

# Module calls are typed as their forward.
mha = tt.MultiHeadAttention(16, 4, num_kv_heads=2)
x = torch.randn(2, 5, 16)
attended, weights = mha(x, is_causal=True)
assert_type(attended, Tensor)
assert_type(weights, None)
# need_weights=True: the weights are a Tensor, no narrowing needed; a flag known only at run time: maybe None.
attended, head_weights = mha(x, need_weights=True, average_attn_weights=False)
assert_type(head_weights, Tensor)
assert_type(head_weights.sum(dim=1), Tensor)
assert_type(mha(x, need_weights=bool(torch.rand(()) > 0.5))[1], Tensor | None)
cache = tt.KVCache()
step, _ = mha(x[:, :1], kv_cache=cache)
assert_type(step, Tensor)

rotary = tt.RotaryEmbedding(4)
assert_type(rotary(q[..., :4]), Tensor)
assert_type(tt.SinusoidalPositionalEncoding(16)(x), Tensor)
assert_type(tt.causal_mask(5, 7), Tensor)
