"""Positional encodings and the KV-cache path of MultiHeadAttention."""

import math
import typing
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.support.properties import exactly
from tests.support.properties import seeded_randn as randn
from typed_transformer import MultiHeadAttention, ShapeError
from typed_transformer.multihead import KVCache
from typed_transformer.positions import (
    ALiBiPositionalBias,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SharedPositions,
    SinusoidalPositionalEncoding,
    alibi_slopes,
    check_positional,
    position_modules,
)


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


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: SinusoidalPositionalEncoding(0),
         "SinusoidalPositionalEncoding: d_model must be a positive int, got 0"),
        (lambda: LearnedPositionalEmbedding(0, 4),
         "LearnedPositionalEmbedding: max_length must be a positive int, got 0"),
        (lambda: LearnedPositionalEmbedding(4, 0), "LearnedPositionalEmbedding: d_model must be a positive int, got 0"),
        (lambda: RotaryEmbedding(0), "RotaryEmbedding: head_dim must be a positive int, got 0"),
        (lambda: RotaryEmbedding(3), "RotaryEmbedding: head_dim must be a positive even number, got 3"),
        (lambda: RotaryEmbedding(4, base=1.0), "RotaryEmbedding: base must be a finite number > 1, got 1.0"),
        (lambda: RotaryEmbedding(4, base=0.5), "RotaryEmbedding: base must be a finite number > 1, got 0.5"),
        (lambda: RotaryEmbedding(4, base=math.inf), "RotaryEmbedding: base must be a finite number > 1, got inf"),
    ],
)
def test_constructors_reject_bad_sizes_with_their_reason(build: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=exactly(message)):
        build()


def test_smallest_valid_sizes_are_accepted() -> None:
    x = randn(1, 2, 1)
    torch.testing.assert_close(SinusoidalPositionalEncoding(1)(x), x + torch.tensor([[0.0], [math.sin(1.0)]],
                                                                                     dtype=torch.float64))
    assert LearnedPositionalEmbedding(1, 1).weight.shape == (1, 1)
    assert RotaryEmbedding(2, base=1.5).base == 1.5


def test_learned_positions_start_as_gpt2s_normal_002() -> None:
    torch.manual_seed(0)
    weight = LearnedPositionalEmbedding(1024, 256).weight.detach()
    assert weight.std().item() == pytest.approx(0.02, rel=0.01)  # 262,144 draws
    assert abs(weight.mean().item()) < 1e-3


def test_learned_positions_overflow_is_a_complete_shape_error() -> None:
    wpe = LearnedPositionalEmbedding(8, 3)
    with pytest.raises(ShapeError) as info:
        wpe(torch.zeros(2, 3, 3), offset=6)
    err = info.value
    assert str(err) == ("typed_transformer.positions.LearnedPositionalEmbedding.forward(): x: positions 6..8 are "
                        "beyond the 8 learned positions (axis t is 3, offset 6)")
    assert (err.function, err.argument, err.axis, err.actual, err.expected) == (
        "typed_transformer.positions.LearnedPositionalEmbedding.forward", "x", "t", 9, 8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_positions_keep_the_dtype_of_x(dtype: torch.dtype) -> None:
    x = torch.zeros(1, 3, 4, dtype=dtype)
    assert LearnedPositionalEmbedding(8, 4)(x).dtype == dtype
    assert SinusoidalPositionalEncoding(4)(x).dtype == dtype
    assert RotaryEmbedding(4)(torch.zeros(1, 2, 3, 4, dtype=dtype)).dtype == dtype


def test_offsets_default_to_zero_and_dtype_is_honoured() -> None:
    x = randn(2, 3, 4)
    wpe = LearnedPositionalEmbedding(8, 4, dtype=torch.float64)
    assert wpe.weight.dtype == torch.float64
    torch.testing.assert_close(wpe(x), x + wpe.weight[:3])
    rotary = RotaryEmbedding(4)
    q = randn(1, 2, 3, 4)
    torch.testing.assert_close(rotary(q), rotary(q, 0))
    torch.testing.assert_close(rotary(q)[:, :, 0], q[:, :, 0])  # position 0 is not rotated
    torch.testing.assert_close(SinusoidalPositionalEncoding(4)(x), SinusoidalPositionalEncoding(4)(x, 0))


def test_alibi_slopes_are_the_papers() -> None:
    # Powers of two: 2^(-8 i / n). 8 heads: 1/2 ... 1/256 (the paper's example).
    assert alibi_slopes(8).tolist() == [2.0 ** -i for i in range(1, 9)]
    assert alibi_slopes(1).tolist() == [2.0 ** -8]
    assert alibi_slopes(4).tolist() == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]
    # Not a power of two: the 4-head slopes, then every other slope of the 8-head sequence (the paper's code).
    assert alibi_slopes(6).tolist() == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]
    assert alibi_slopes(3).tolist() == [2.0 ** -4, 2.0 ** -8, 2.0 ** -2]
    with pytest.raises(ValueError, match="num_heads must be a positive int, got 0"):
        alibi_slopes(0)


def test_alibi_bias_values_and_bottom_right_alignment() -> None:
    alibi = ALiBiPositionalBias(2)
    bias = alibi(3)
    assert bias.shape == (1, 2, 3, 3)
    assert bias.dtype == torch.float32
    m = alibi_slopes(2)
    for h in range(2):
        for i in range(3):
            for j in range(3):
                assert bias[0, h, i, j].item() == pytest.approx(-m[h].item() * abs(i - j))
    # 2 new queries after 3 cached keys are the last two rows of the 5 x 5 bias.
    torch.testing.assert_close(alibi(2, 5), alibi(5)[:, :, 3:], rtol=0, atol=0)
    assert alibi(4, dtype=torch.float64).dtype == torch.float64
    assert alibi.state_dict() == {}  # no parameters, nothing persistent
    with pytest.raises(ValueError, match="non-negative"):
        alibi(-1)


# ----------------------------------------------------------------------------------------------------
# The kinds, by name
# ----------------------------------------------------------------------------------------------------


def test_each_model_names_its_kinds_from_the_shared_vocabulary() -> None:
    from typed_transformer.gpt import Positional
    from typed_transformer.seq2seq import Positions

    assert typing.get_args(SharedPositions) == ("learned", "sinusoidal", "rope")
    assert typing.get_args(Positional) == ("learned", "sinusoidal", "rope", "alibi")
    assert typing.get_args(Positions) == ("learned", "sinusoidal", "rope", "none")


@pytest.mark.parametrize(
    ("kind", "built"),
    [("learned", LearnedPositionalEmbedding), ("sinusoidal", SinusoidalPositionalEncoding), ("rope", RotaryEmbedding),
     ("alibi", ALiBiPositionalBias), ("none", type(None))],
)
def test_position_modules_builds_one_module_per_kind(kind: str, built: type) -> None:
    kinds = typing.Literal[SharedPositions, "alibi", "none"]
    modules = position_modules("Owner", kind, kinds, d_model=8, num_heads=2, max_length=6)
    present = [m for m in (modules.embedding, modules.rotary, modules.alibi) if m is not None]
    assert [type(m) for m in present] == ([] if built is type(None) else [built])
    if kind == "learned":
        assert modules.embedding is not None
        assert modules.embedding.weight.shape == (6, 8)
    if kind == "rope":
        assert modules.rotary is not None
        assert modules.rotary.head_dim == 4


@pytest.mark.parametrize(
    ("kind", "sizes", "message"),
    [("xpos", {}, "Owner: positional must be learned, sinusoidal, rope or alibi, got 'xpos'"),
     ("none", {}, "Owner: positional must be learned, sinusoidal, rope or alibi, got 'none'"),
     ("learned", {"max_length": None}, "Owner: positional='learned' needs max_length (the size of the table)"),
     ("rope", {"d_model": 6, "num_heads": 2}, "Owner: rope needs an even head size, got 3")],
)
def test_check_positional_names_the_kind_or_the_size_that_does_not_fit(kind: str, sizes: dict[str, Any],
                                                                       message: str) -> None:
    kinds = typing.Literal[SharedPositions, "alibi"]
    arguments: dict[str, Any] = {"d_model": 8, "num_heads": 2, "max_length": 6, **sizes}
    with pytest.raises(ValueError, match=exactly(message)):
        check_positional("Owner", kind, kinds, **arguments)
