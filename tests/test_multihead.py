"""MultiHeadAttention: seed 001's module, an independent per-head reference, torch interop."""

import math

import pytest
import torch
from torch import Tensor, nn

from typed_transformer import MultiHeadAttention, ShapeError


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
    ours = MultiHeadAttention.from_torch(theirs)
    back = ours.to_torch()
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
        MultiHeadAttention(8, 4, num_kv_heads=2).to_torch()
    with pytest.raises(ValueError, match="input_dim == d_model"):
        MultiHeadAttention(8, 4, input_dim=6).to_torch()
    with pytest.raises(TypeError, match=r"expected nn\.MultiheadAttention"):
        MultiHeadAttention.from_torch(nn.Linear(2, 2))  # type: ignore[arg-type]


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
