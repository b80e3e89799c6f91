"""A user's own model code: layers, the GPT and the torch interop, under mypy --strict."""

from typing import assert_type

import torch
from torch import Tensor, nn

import typed_transformer as tt

layer = tt.TransformerEncoderLayer(16, 4, 32)
src = torch.randn(2, 6, 16)
assert_type(layer(src, is_causal=True), Tensor)
model = tt.Transformer(16, 4, 1, 1, 32)
assert_type(model(src, torch.randn(2, 3, 16), tgt_is_causal=True), Tensor)

gpt = tt.GPT(tt.GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
idx = torch.zeros(1, 4, dtype=torch.long)
logits, loss = gpt(idx, idx)
assert_type(logits, Tensor)
assert_type(loss, Tensor | None)
if loss is not None:
    assert_type(loss.item(), float | int | bool)
assert_type(gpt.generate(idx, 3, greedy=True), Tensor)

seq2seq = tt.Seq2SeqTransformer(11, 13, 0, 0, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                dim_feedforward=16)
assert_type(seq2seq(idx, idx), Tensor)

# from_torch / to_torch: each torch class maps to ours and back, by overload.
assert_type(tt.from_torch(nn.MultiheadAttention(16, 4, batch_first=True)), tt.MultiHeadAttention)
assert_type(tt.from_torch(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)), tt.TransformerEncoderLayer)
decoder_layer = nn.TransformerDecoderLayer(16, 4, 32, batch_first=True)
assert_type(tt.from_torch(nn.TransformerDecoder(decoder_layer, 1)), tt.TransformerDecoder)
assert_type(tt.from_torch(nn.Transformer(16, 4, 1, 1, 32, batch_first=True)), tt.Transformer)
assert_type(tt.to_torch(mha := tt.MultiHeadAttention(16, 4)), nn.MultiheadAttention)
assert_type(tt.to_torch(model), nn.Transformer)
assert_type(tt.to_torch(layer, batch_first=False), nn.TransformerEncoderLayer)
assert_type(mha, tt.MultiHeadAttention)
