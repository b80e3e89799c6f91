"""Mistakes that mypy --strict must reject (each marked line ends in '# E: <code>')."""

import torch
from torch import nn

import typed_transformer as tt

mha = tt.MultiHeadAttention(16, 4)
x = torch.randn(2, 5, 16)

# The module returns (output, weights): a tuple has no transpose.
mha(x).transpose(1, 2)  # E: attr-defined
# A keyword forward does not take.
mha(x, causal=True)  # E: call-overload
# The weights are None unless asked for: without need_weights there are none, and with a flag whose value is
# unknown they must be checked before use.
_, no_weights = mha(x)
no_weights.sum()  # E: attr-defined
asked = bool(torch.rand(()) > 0.5)
_, weights = mha(x, need_weights=asked)
weights.sum()  # E: union-attr
# The GPT's loss is None without targets.
_, loss = tt.GPT(tt.GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4))(torch.zeros(1, 2).long())
loss.item()  # E: union-attr
# from_torch converts only what the library mirrors.
tt.from_torch(nn.Linear(2, 2))  # E: call-overload
# A flag whose value is unknown gives the union: the output is not known to be a Tensor.
flag = bool(torch.rand(()) > 0.5)
tt.scaled_dot_product_attention(x[None], x[None], x[None], return_weights=flag).transpose(1, 2)  # E: union-attr
# The backend is one of two names.
tt.scaled_dot_product_attention(x[None], x[None], x[None], backend="flash")  # E: call-overload
