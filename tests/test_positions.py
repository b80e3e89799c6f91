"""Positional encodings and the KV-cache path of MultiHeadAttention."""

import math

import pytest
import torch
from torch import Tensor

from typed_transformer import MultiHeadAttention, ShapeError
from typed_transformer.multihead import KVCache
from typed_transformer.positions import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding


def randn(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_sinusoidal_matches_the_papers_formula() -> None:
    d = 6
    pe = SinusoidalPositionalEncoding(d)
    out = pe(torch.zeros(1, 5, d, dtype=torch.float64), offset=3)
    for pos in range(5):
        for i in range(d // 2):
            angle = (pos + 3) / 10000 ** (2 * i / d)
            assert out[0, pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert out[0, pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)


def test_sinusoidal_odd_width_and_any_length() -> None:
    out = SinusoidalPositionalEncoding(5)(torch.zeros(1, 20000, 5))
    assert out.shape == (1, 20000, 5)
    assert out[0, 0].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]


def test_learned_positions_refuse_lengths_beyond_the_table() -> None:
    wpe = LearnedPositionalEmbedding(4, 3)
    x = torch.zeros(2, 3, 3)
    torch.testing.assert_close(wpe(x, offset=1), wpe.weight[1:4].expand(2, 3, 3))
    with pytest.raises(ShapeError) as info:
        wpe(x, offset=2)
    assert info.value.reason == "positions 2..4 are beyond the 4 learned positions (axis t is 3, offset 2)"


def test_rotary_preserves_norms_and_depends_only_on_relative_offset() -> None:
    rope = RotaryEmbedding(8)
    q, k = randn(1, 1, 1, 8, seed=1), randn(1, 1, 1, 8, seed=2)
    torch.testing.assert_close(rope(q, 5).norm(), q.norm())
    near = (rope(q, 3) * rope(k, 1)).sum()
    far = (rope(q, 103) * rope(k, 101)).sum()
    torch.testing.assert_close(near, far)
    torch.testing.assert_close(rope(q, 0), q)  # position 0: no rotation
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(7)


def test_rotary_split_half_convention() -> None:
    # Pairs (x[i], x[i + d/2]) rotate together by pos * base^(-2i/d).
    x = torch.tensor([[[[1.0, 0.0, 0.0, 0.0]]]], dtype=torch.float64)
    out = RotaryEmbedding(4)(x, offset=1)
    torch.testing.assert_close(out[0, 0, 0], torch.tensor([math.cos(1), 0.0, math.sin(1), 0.0], dtype=torch.float64))


@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize(("bias_kv", "zero_attn"), [(False, False), (True, False), (False, True)])
def test_kv_cache_decoding_equals_the_full_causal_pass(rotary: bool, bias_kv: bool, zero_attn: bool) -> None:
    torch.manual_seed(0)
    rope = RotaryEmbedding(4) if rotary else None
    m = MultiHeadAttention(16, 4, num_kv_heads=2, rotary=rope, add_bias_kv=bias_kv, add_zero_attn=zero_attn).double()
    x = randn(2, 7, 16)
    full, _ = m(x, is_causal=True)
    cache = KVCache()
    pieces = [m(x[:, :3], is_causal=True, kv_cache=cache)[0]]
    for i in range(3, 7):
        pieces.append(m(x[:, i : i + 1], is_causal=True, kv_cache=cache)[0])
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-12, atol=1e-12)
    assert cache.length == 7


def test_kv_cache_errors() -> None:
    m = MultiHeadAttention(8, 2)
    cache = KVCache()
    m(randn(2, 3, 8).float(), kv_cache=cache)
    with pytest.raises(ShapeError) as info:  # masks must cover the cached positions too
        m(randn(2, 1, 8).float(), kv_cache=cache, key_padding_mask=torch.ones(2, 1, dtype=torch.bool))
    assert (info.value.argument, info.value.actual, info.value.expected) == ("key_padding_mask", 1, 4)
    with pytest.raises(ShapeError) as info:
        m(randn(3, 1, 8).float(), kv_cache=cache)
    assert info.value.argument == "k"
    with pytest.raises(ValueError, match="self-attention"):
        m(randn(2, 1, 8).float(), randn(2, 1, 8).float(), kv_cache=cache)
    cache.crop(2)
    assert cache.length == 2
    cache.reset()
    assert cache.length == 0
