"""MultiHeadAttention: seed 001's module, an independent per-head reference, torch interop."""

import math
from typing import Any

import pytest
import torch
from einops import rearrange
from torch import Tensor, nn

from tests.support.properties import exactly
from typed_transformer import MultiHeadAttention, ShapeError, scaled_dot_product_attention
from typed_transformer.attention import Backend
from typed_transformer.interop import from_torch, to_torch
from typed_transformer.masks import attn_mask_to_torch, key_padding_mask_to_torch
from typed_transformer.multihead import KVCache
from typed_transformer.positions import RotaryEmbedding


def per_head_reference(m: MultiHeadAttention, x: Tensor) -> Tensor:
    """Seed 000/002's formulation: h independent heads, each Attention(X W_q^i, X W_k^i, X W_v^i),
    concatenated and projected by W^O. Written with loops and plain matmuls, independent of the module."""
    assert m.in_proj is not None
    w_q, w_k, w_v = torch.split(m.in_proj.weight, m.d_model, dim=0)
    assert m.in_proj.bias is not None
    b_q, b_k, b_v = torch.split(m.in_proj.bias, m.d_model, dim=0)
    heads = []
    for i in range(m.num_heads):
        rows = slice(i * m.head_dim, (i + 1) * m.head_dim)
        q = x @ w_q[rows].T + b_q[rows]
        k = x @ w_k[rows].T + b_k[rows]
        v = x @ w_v[rows].T + b_v[rows]
        heads.append(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(m.head_dim), dim=-1) @ v)
    out: Tensor = m.out_proj(torch.cat(heads, dim=-1))
    return out


def test_seed_001_module_with_query_width_different_from_d_model() -> None:
    torch.manual_seed(0)
    m = MultiHeadAttention(512, 8, input_dim=1024).double()
    x = torch.randn(30, 5, 1024, dtype=torch.float64)
    with torch.no_grad():
        m.in_proj.bias.normal_()  # type: ignore[union-attr]
        out, weights = m(x)
    assert out.shape == (30, 5, 512)
    assert weights is None
    assert m.in_proj is not None
    assert m.in_proj.weight.shape == (1536, 1024)  # seed 001's qkv_layer
    torch.testing.assert_close(out, per_head_reference(m, x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_backends_agree(backend: str) -> None:
    torch.manual_seed(0)
    m = MultiHeadAttention(16, 4, num_kv_heads=2, backend=backend).double()  # type: ignore[arg-type]
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    out, _ = m(x, is_causal=True)
    ref, weights = m(x, is_causal=True, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert weights is not None
    assert weights.shape == (2, 4, 6, 6)
    assert torch.equal(weights.triu(1), torch.zeros_like(weights))


CONFIGS = [
    {},
    {"bias": False},
    {"kdim": 6, "vdim": 5},
    {"add_bias_kv": True},
    {"add_zero_attn": True},
    {"add_bias_kv": True, "add_zero_attn": True, "kdim": 3, "vdim": 7, "bias": False},
]


@pytest.mark.parametrize("config", CONFIGS)
def test_from_torch_and_back(config: dict[str, object]) -> None:
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64, **config)
    ours = from_torch(theirs)
    back = to_torch(ours)
    assert theirs.state_dict().keys() == back.state_dict().keys()
    for key, value in theirs.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key
    q = torch.randn(2, 3, 8, dtype=torch.float64)
    kv = torch.randn(2, 4, ours.kdim, dtype=torch.float64), torch.randn(2, 4, ours.vdim, dtype=torch.float64)
    want, want_w = theirs(q, *kv)
    got, got_w = ours(q, *kv, need_weights=True)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got_w, want_w, rtol=1e-10, atol=1e-10)


def test_to_torch_refuses_what_torch_cannot_express() -> None:
    with pytest.raises(ValueError, match="grouped-query"):
        to_torch(MultiHeadAttention(8, 4, num_kv_heads=2))
    with pytest.raises(ValueError, match="input_dim == d_model"):
        to_torch(MultiHeadAttention(8, 4, input_dim=6))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"d_model": 10, "num_heads": 4}, "d_model=10 is not divisible by num_heads=4"),
        ({"d_model": 8, "num_heads": 4, "num_kv_heads": 3}, "num_heads=4 is not divisible by num_kv_heads=3"),
        ({"d_model": 0, "num_heads": 1}, "d_model must be a positive int"),
        ({"d_model": 8, "num_heads": 2, "dropout": 1.5}, "dropout must be in"),
        ({"d_model": 8, "num_heads": 2, "backend": "flash"}, "backend must be"),
    ],
)
def test_constructor_rejects_bad_sizes(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(**kwargs)  # type: ignore[arg-type]


def test_forward_argument_errors() -> None:
    m = MultiHeadAttention(8, 2)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match="value was given without key"):
        m(x, None, x)
    with pytest.raises(ShapeError) as info:
        m(x, attn_mask=torch.ones(5, 6, dtype=torch.bool))
    assert (info.value.argument, info.value.axis, info.value.actual, info.value.expected) == ("attn_mask", "s", 6, 5)
    with pytest.raises(ShapeError) as info:
        m(x, x[:1])
    assert (info.value.argument, info.value.axis) == ("key", "b")
    with pytest.raises(ShapeError) as info:
        m(x, attn_mask=torch.ones(2, 3, 5, 5, dtype=torch.bool))
    assert (info.value.argument, info.value.axis) == ("attn_mask", "num_heads")


def test_repr_names_the_configuration() -> None:
    assert repr(MultiHeadAttention(8, 4, num_kv_heads=2, input_dim=6)).startswith(
        "MultiHeadAttention(\n  d_model=8, num_heads=4, num_kv_heads=2, input_dim=6, backend='sdpa'")


# ---------------------------------------------------------------------------------------------------------
# The exact contract: error texts, KVCache, rotary, dropout, masks combined, interop options. Each test
# below was written for a mutant that the suite above let survive.
# ---------------------------------------------------------------------------------------------------------


def contents(cache: KVCache) -> tuple[Tensor | None, Tensor | None, int]:
    return cache.k, cache.v, cache.length


def test_kv_cache_append_crop_reset() -> None:
    cache = KVCache()
    assert contents(cache) == (None, None, 0)
    k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 5)
    assert cache.append(k, v) == (k, v)
    k2, v2 = torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 5)
    all_k, all_v = cache.append(k2, v2)
    assert torch.equal(all_k, torch.cat([k, k2], dim=2))
    assert torch.equal(all_v, torch.cat([v, v2], dim=2))
    cache.crop(10)  # more than it holds: keeps everything
    assert cache.k is not None
    assert torch.equal(cache.k, all_k)
    cache.crop(2)
    assert cache.k is not None
    assert cache.v is not None
    assert torch.equal(cache.k, k2)
    assert torch.equal(cache.v, v2)
    cache.crop(0)
    assert cache.length == 0
    with pytest.raises(ValueError, match=exactly("KVCache.crop: keep_last must be non-negative, got -1")):
        cache.crop(-1)
    cache.reset()
    assert contents(cache) == (None, None, 0)
    empty = KVCache()
    empty.crop(3)
    assert (empty.k, empty.v) == (None, None)


@pytest.mark.parametrize(
    ("k_shape", "v_shape", "argument", "message"),
    [
        ((2, 2, 1, 4), (2, 2, 1, 5), "k", "is (2, 2, 1, 4), but the cache holds (1, 2, 3, 4)"),
        ((1, 2, 1, 4), (1, 2, 1, 6), "v", "is (1, 2, 1, 6), but the cache holds (1, 2, 3, 5)"),
    ],
)
def test_kv_cache_refuses_another_layout(k_shape: tuple[int, ...], v_shape: tuple[int, ...], argument: str,
                                         message: str) -> None:
    cache = KVCache()
    cache.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 5))
    with pytest.raises(ShapeError) as info:
        cache.append(torch.zeros(k_shape), torch.zeros(v_shape))
    assert str(info.value) == (f"typed_transformer.multihead.KVCache.append(): {argument}: {message} "
                               "(b, g and the head size must stay the same)")
    assert (info.value.function, info.value.argument) == ("typed_transformer.multihead.KVCache.append", argument)


@pytest.mark.parametrize("name", ["d_model", "num_heads", "num_kv_heads", "input_dim", "kdim", "vdim"])
def test_constructor_names_the_bad_size(name: str) -> None:
    sizes: dict[str, Any] = {"d_model": 8, "num_heads": 2, name: 0}
    with pytest.raises(ValueError, match=exactly(f"MultiHeadAttention: {name} must be a positive int, got 0")):
        MultiHeadAttention(**sizes)


def test_constructor_range_checks_are_exact() -> None:
    with pytest.raises(ValueError, match=exactly("MultiHeadAttention: dropout must be in [0, 1), got 1.0")):
        MultiHeadAttention(8, 2, dropout=1.0)
    with pytest.raises(ValueError, match=exactly(
            "MultiHeadAttention: rotary.head_dim=2 does not match the head size d_model/num_heads=4")):
        MultiHeadAttention(8, 2, rotary=RotaryEmbedding(2))


def test_extra_repr_lists_every_non_default() -> None:
    assert MultiHeadAttention(8, 2, kdim=3, vdim=5, dropout=0.1).extra_repr() == (
        "d_model=8, num_heads=2, kdim=3, vdim=5, dropout=0.1, backend='sdpa'")
    assert MultiHeadAttention(8, 2, backend="reference").extra_repr() == "d_model=8, num_heads=2, backend='reference'"


def test_bias_kv_initialisation_matches_torch() -> None:
    """N(0, 1/kv_dim), the distribution of torch's xavier_normal_ on its (1, 1, E) bias_k."""
    torch.manual_seed(0)
    ours = MultiHeadAttention(64, 4, add_bias_kv=True)
    theirs = nn.MultiheadAttention(64, 4, add_bias_kv=True)
    our_draws, their_draws = [], []
    for _ in range(100):
        ours.reset_parameters()
        theirs._reset_parameters()
        assert ours.bias_k is not None
        assert ours.bias_v is not None
        assert theirs.bias_k is not None
        assert theirs.bias_v is not None
        our_draws += [ours.bias_k.detach().clone(), ours.bias_v.detach().clone()]
        their_draws += [theirs.bias_k.detach().flatten().clone(), theirs.bias_v.detach().flatten().clone()]
    ours_std, theirs_std = torch.cat(our_draws).std().item(), torch.cat(their_draws).std().item()
    assert ours_std == pytest.approx(1 / 8, rel=0.02)  # 12,800 draws: the sample std is within ~0.6%
    assert ours_std == pytest.approx(theirs_std, rel=0.03)


def test_forward_error_texts() -> None:
    name = "typed_transformer.multihead.MultiHeadAttention.forward"
    x = torch.randn(2, 5, 8)
    m = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=exactly("MultiHeadAttention.forward: value was given without key")):
        m(x, None, x)
    for argument, args in (("key", (x, x.double())), ("value", (x, x, x.double()))):
        with pytest.raises(ShapeError) as info:
            m(*args)
        assert str(info.value) == f"{name}(): {argument}: dtype is float64, expected float32 (the dtype of query)"
    with pytest.raises(ValueError, match=exactly("MultiHeadAttention.forward: kv_cache and rotary embeddings are "
                                                 "for self-attention (key and value must be None)")):
        m(x, x, kv_cache=KVCache())
    with pytest.raises(ShapeError) as info:
        m(x, attn_mask=torch.ones(5, 6, dtype=torch.bool))
    assert str(info.value) == f"{name}(): attn_mask: axis s is 6, expected 5 (self-attention: s = t, bound by query)"
    assert (info.value.axis, info.value.actual, info.value.expected, info.value.bound_by) == ("s", 6, 5, "query")
    cache = KVCache()
    m(x, kv_cache=cache)
    with pytest.raises(ShapeError) as info:
        m(x, key_padding_mask=torch.ones(2, 6, dtype=torch.bool), kv_cache=cache)
    assert str(info.value) == (f"{name}(): key_padding_mask: axis s is 6, expected 10 "
                               "(self-attention with 5 cached positions, bound by query)")
    assert (info.value.axis, info.value.actual, info.value.expected, info.value.bound_by) == ("s", 6, 10, "query")


@pytest.mark.parametrize(("kwargs", "axis", "expected"), [({"kdim": 3}, "kdim", 3), ({"vdim": 3}, "vdim", 3)])
def test_self_attention_needs_keys_of_the_query_width(kwargs: dict[str, Any], axis: str, expected: int) -> None:
    m = MultiHeadAttention(8, 2, **kwargs)
    with pytest.raises(ShapeError) as info:
        m(torch.randn(2, 5, 8))
    widths = f"kdim={m.kdim}, vdim={m.vdim}"
    assert str(info.value) == (
        "typed_transformer.multihead.MultiHeadAttention.forward(): key: is None (self-attention), but this module "
        f"takes keys/values of width {widths}, not the query width input_dim=8; pass key and value")
    assert (info.value.argument, info.value.axis, info.value.expected) == ("key", axis, expected)


def test_value_defaults_to_key() -> None:
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2).double()
    q, kv = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 4, 8, dtype=torch.float64)
    assert torch.equal(m(q, kv)[0], m(q, kv, kv)[0])


def test_two_dimensional_attn_mask_with_key_padding_mask_matches_torch() -> None:
    torch.manual_seed(0)
    ours = MultiHeadAttention(8, 2).double()
    theirs = to_torch(ours)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    keep = torch.rand(5, 5) > 0.3
    keep[:, 0] = True
    padding = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    float_padding = torch.zeros(2, 5, dtype=torch.float64).masked_fill(~padding, float("-inf"))
    for mask, torch_padding in ((keep, key_padding_mask_to_torch(padding)),
                                (torch.where(keep, 0.0, -2.0).double(), float_padding)):
        want, _ = theirs(x, x, x, attn_mask=attn_mask_to_torch(mask), key_padding_mask=torch_padding,
                         need_weights=False)
        got, _ = ours(x, attn_mask=mask, key_padding_mask=padding)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def independent_rotary_attention(m: MultiHeadAttention, x: Tensor, offset: int = 0) -> Tensor:
    """Projections, RoPE on q and k (split-half pairing as in GPT-NeoX: (x_i, x_{i+d/2}) rotated by the angle
    position * theta_i, theta_i = 10000^(-2i/d)) and causal softmax attention, in plain torch and loops,
    independent of the module."""
    assert m.in_proj is not None
    assert m.in_proj.bias is not None
    d = m.head_dim
    w_q, w_k, w_v = torch.split(m.in_proj.weight, m.d_model)
    b_q, b_k, b_v = torch.split(m.in_proj.bias, m.d_model)
    q, k, v = x @ w_q.T + b_q, x @ w_k.T + b_k, x @ w_v.T + b_v
    positions = torch.arange(offset, offset + x.shape[1], dtype=x.dtype)
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    cos, sin = torch.cos(positions[:, None] * theta), torch.sin(positions[:, None] * theta)

    def rotate(z: Tensor) -> Tensor:
        first, second = z[..., : d // 2], z[..., d // 2 :]
        return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)

    heads = []
    t = x.shape[1]
    for i in range(m.num_heads):
        cols = slice(i * d, (i + 1) * d)
        logits = rotate(q[..., cols]) @ rotate(k[..., cols]).transpose(-1, -2) / math.sqrt(d)
        logits = logits.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        heads.append(torch.softmax(logits, dim=-1) @ v[..., cols])
    out: Tensor = m.out_proj(torch.cat(heads, dim=-1))
    return out


def test_rotary_multihead_matches_an_independent_reference() -> None:
    torch.manual_seed(0)
    m = MultiHeadAttention(16, 2, rotary=RotaryEmbedding(8)).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    torch.testing.assert_close(m(x, is_causal=True)[0], independent_rotary_attention(m, x), rtol=1e-10, atol=1e-10)
    # A cache of 4 positions: the next two queries sit at positions 4 and 5 and see all six keys.
    cache = KVCache()
    m(x[:, :4], is_causal=True, kv_cache=cache)
    torch.testing.assert_close(m(x[:, 4:], is_causal=True, kv_cache=cache)[0],
                               independent_rotary_attention(m, x)[:, 4:], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_dropout_in_training_mode_is_the_cores_dropout(backend: Backend) -> None:
    """Same seed, same dropout draws: the module applies dropout_p through the backend it was given."""
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2, dropout=0.5, backend=backend).double().train()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    assert m.in_proj is not None
    q, k, v = (rearrange(part, "b t (h d) -> b h t d", h=2) for part in m.in_proj(x).split(8, dim=-1))
    torch.manual_seed(1)
    core = scaled_dot_product_attention(q, k, v, dropout_p=0.5, backend=backend)
    assert isinstance(core, Tensor)
    want = m.out_proj(rearrange(core, "b h t d -> b t (h d)"))
    torch.manual_seed(1)
    got, _ = m(x)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(got, m.eval()(x)[0])


def test_interop_carries_dropout_and_backend() -> None:
    ours = from_torch(nn.MultiheadAttention(8, 2, dropout=0.25), backend="reference")
    assert (ours.dropout, ours.backend) == (0.25, "reference")
    assert to_torch(ours).dropout == 0.25
    with pytest.raises(ValueError, match=exactly(
            "to_torch: nn.MultiheadAttention has no grouped-query heads (num_kv_heads=2, num_heads=4)")):
        to_torch(MultiHeadAttention(8, 4, num_kv_heads=2))
    with pytest.raises(ValueError, match=exactly(
            "to_torch: nn.MultiheadAttention needs input_dim == d_model, got input_dim=6, d_model=8")):
        to_torch(MultiHeadAttention(8, 4, input_dim=6))


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
@pytest.mark.parametrize("extras", [{}, {"add_bias_kv": True}, {"add_zero_attn": True},
                                    {"add_bias_kv": True, "add_zero_attn": True}])
def test_attn_bias_equals_torch_with_the_bias_as_float_mask(backend: Backend, extras: dict[str, bool]) -> None:
    # torch's float attn_mask is additive and gives the appended bias_k / zero keys a bias of 0: our attn_bias
    # must do the same. Cross-attention, t=3 queries, s=5 keys.
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(8, 2, batch_first=True, **extras).double().eval()
    ours = from_torch(theirs, backend=backend)
    assert isinstance(ours, MultiHeadAttention)
    query, memory = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    bias = torch.randn(3, 5, dtype=torch.float64)
    out, _ = ours(query, memory, memory, attn_bias=bias)
    expected, _ = theirs(query, memory, memory, attn_mask=bias, need_weights=False)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    out_w, weights = ours(query, memory, memory, attn_bias=bias, need_weights=True)
    expected_w, torch_weights = theirs(query, memory, memory, attn_mask=bias)
    torch.testing.assert_close(out_w, expected_w, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(weights, torch_weights, rtol=1e-10, atol=1e-10)


def test_attn_bias_per_head_with_a_kv_cache_equals_the_full_pass() -> None:
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 4, num_kv_heads=2).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    bias = torch.randn(1, 4, 5, 5, dtype=torch.float64)
    full, _ = m(x, is_causal=True, attn_bias=bias)
    cache = KVCache()
    first, _ = m(x[:, :3], is_causal=True, kv_cache=cache, attn_bias=bias[:, :, :3, :3])
    second, _ = m(x[:, 3:], is_causal=True, kv_cache=cache, attn_bias=bias[:, :, 3:, :])
    torch.testing.assert_close(torch.cat([first, second], dim=1), full, rtol=1e-12, atol=1e-12)
    with pytest.raises(ShapeError, match="attn_bias: axis s is 2, expected 7"):
        m(x[:, 3:], kv_cache=cache, attn_bias=bias[:, :, 3:, 3:])
    with pytest.raises(ShapeError, match="attn_bias"):
        m(x, attn_bias=torch.randn(1, 3, 5, 5, dtype=torch.float64))  # 3 heads, the module has 4


# --- a key padding mask with torch's polarity (issue 43 item 4) ---------------------------------------------------


def test_a_padding_row_with_no_key_is_named_with_the_fix() -> None:
    """torch's polarity (True = padding) passed as ours: an unpadded sequence is all False, and every output of it
    would be zeros. The warning names the rows and the conversion."""
    import warnings

    from typed_transformer import key_padding_mask_from_torch

    mha = MultiHeadAttention(8, 2)
    x = torch.randn(3, 4, 8)
    torch_style = torch.tensor([[False] * 4, [False, False, True, True], [False] * 4])  # True = padding
    with pytest.warns(UserWarning, match=r"batch row\(s\) 0, 2 let no key be attended.*key_padding_mask_from_torch"):
        out, _ = mha(x, key_padding_mask=torch_style)
    assert torch.equal(out[0], mha.out_proj.bias.expand(4, 8))  # zeros before the output projection
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mha(x, key_padding_mask=key_padding_mask_from_torch(torch_style))


def test_a_sequence_first_input_is_named_as_such() -> None:
    """A (t, b, e) input beside a (b, s) mask: the error says the input looks sequence-first, not only that the
    mask's axis is wrong (issue 43 item 4); a batch-first input with a wrong mask gets no such hint."""
    from jaxtyping import TypeCheckError

    from typed_transformer import TransformerEncoderLayer

    x, padding = torch.randn(10, 2, 8), torch.ones(2, 10, dtype=torch.bool)
    with pytest.raises(TypeCheckError, match=r"query \(10, 2, 8\) looks sequence-first.*'t b e -> b t e'"):
        MultiHeadAttention(8, 2)(x, key_padding_mask=padding)
    with pytest.raises(TypeCheckError, match=r"axis b is 2, expected 10 \(bound by src\); src \(10, 2, 8\) looks "
                                             r"sequence-first"):
        TransformerEncoderLayer(8, 2, 16)(x, src_key_padding_mask=padding)
    with pytest.raises(TypeCheckError) as info:
        MultiHeadAttention(8, 2)(torch.randn(2, 10, 8), key_padding_mask=torch.ones(2, 9, dtype=torch.bool))
    assert "sequence-first" not in str(info.value)
