"""Worked examples of the attention core's specified behaviour (the property suite covers the rest)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from tests.support.properties import seeded_randn as randn
from typed_transformer import (
    ShapeError,
    causal_mask,
    scaled_dot_product_attention,
    scaled_dot_product_attention_with_weights,
    shape_checks,
)
from typed_transformer.attention import Backend

BACKENDS: list[Backend] = ["reference", "sdpa"]


def naive(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None = None) -> Tensor:
    """The paper's equation, one head at a time, with plain matmuls."""
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if keep is not None:
        logits = logits.masked_fill(~keep, float("-inf"))
    return logits.softmax(-1) @ v


@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_the_equation(backend: Backend) -> None:
    q, k, v = randn(2, 3, 4, 5, seed=1), randn(2, 3, 6, 5, seed=2), randn(2, 3, 6, 7, seed=3)
    out = scaled_dot_product_attention(q, k, v, backend=backend)
    torch.testing.assert_close(out, naive(q, k, v), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_is_bottom_right_aligned_for_a_kv_cache(backend: Backend) -> None:
    # 2 new queries after 3 cached keys: query 0 sees keys 0..3, query 1 sees keys 0..4.
    q, k, v = randn(1, 1, 2, 4, seed=1), randn(1, 1, 5, 4, seed=2), randn(1, 1, 5, 4, seed=3)
    keep = torch.tensor([[True, True, True, True, False], [True] * 5])
    out = scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend)
    torch.testing.assert_close(out, naive(q, k, v, keep), rtol=1e-12, atol=1e-12)
    # The last rows of a full causal pass equal the cached step.
    full_q = torch.cat([randn(1, 1, 3, 4, seed=9), q], dim=2)
    full = scaled_dot_product_attention(full_q, k, v, is_causal=True, backend=backend)
    assert isinstance(full, Tensor)
    torch.testing.assert_close(full[:, :, 3:], out, rtol=1e-12, atol=1e-12)


def test_causal_mask_values() -> None:
    assert causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert causal_mask(3, 2).tolist() == [[False, False], [True, False], [True, True]]
    with pytest.raises(ValueError, match="non-negative"):
        causal_mask(-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_rows_give_zero_output_and_finite_gradients(backend: Backend) -> None:
    q, k, v = (randn(1, 2, 3, 4, seed=i).requires_grad_() for i in range(3))
    keep = torch.ones(3, 3, dtype=torch.bool)
    keep[1] = False  # query 1 may attend to nothing
    out = scaled_dot_product_attention(q, k, v, attn_mask=keep, backend=backend)
    assert isinstance(out, Tensor)
    assert torch.equal(out[:, :, 1], torch.zeros(1, 2, 4, dtype=torch.float64))
    torch.testing.assert_close(out[:, :, [0, 2]], naive(q, k, v, keep)[:, :, [0, 2]])
    out.sum().backward()  # type: ignore[no-untyped-call]
    for tensor in (q, k, v):
        assert tensor.grad is not None
        assert torch.isfinite(tensor.grad).all()
    assert q.grad is not None
    assert torch.equal(q.grad[:, :, 1], torch.zeros(1, 2, 4, dtype=torch.float64))


def test_fully_masked_rows_have_zero_weights_also_with_float_masks() -> None:
    q, k, v = randn(1, 1, 2, 4, seed=1), randn(1, 1, 3, 4, seed=2), randn(1, 1, 3, 4, seed=3)
    bias = torch.zeros(2, 3, dtype=torch.float64)
    bias[0] = float("-inf")
    out, weights = scaled_dot_product_attention_with_weights(q, k, v, attn_mask=bias)
    assert torch.equal(weights[0, 0, 0], torch.zeros(3, dtype=torch.float64))
    assert torch.equal(out[0, 0, 0], torch.zeros(4, dtype=torch.float64))
    torch.testing.assert_close(weights[0, 0, 1].sum(), torch.tensor(1.0, dtype=torch.float64))
    # torch's documented reference gives NaN for such a row; F.scaled_dot_product_attention gives 0.
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=bias))


def test_half_precision_softmax_runs_in_float32() -> None:
    q, k, v = (randn(2, 2, 5, 8, seed=i, dtype=torch.float32).to(torch.bfloat16) for i in range(3))
    out = scaled_dot_product_attention(q, k, v)
    assert isinstance(out, Tensor)
    assert out.dtype == torch.bfloat16
    # Exactly the float32 computation on the same (bf16-rounded) inputs, rounded once at the end.
    expected = scaled_dot_product_attention(q.float(), k.float(), v.float())
    assert isinstance(expected, Tensor)
    assert torch.equal(out, expected.to(torch.bfloat16))


def test_scale_is_honoured() -> None:
    q, k, v = randn(1, 2, 3, 4, seed=1), randn(1, 2, 3, 4, seed=2), randn(1, 2, 3, 4, seed=3)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, scale=0.3),
                               scaled_dot_product_attention(q * 0.3 * math.sqrt(4), k, v))


def test_dropout_is_applied_to_the_returned_weights() -> None:
    q, k, v = randn(1, 1, 6, 4, seed=1), randn(1, 1, 6, 4, seed=2), randn(1, 1, 6, 4, seed=3)
    torch.manual_seed(0)
    out, weights = scaled_dot_product_attention_with_weights(q, k, v, dropout_p=0.5)
    torch.testing.assert_close(out, weights @ v)
    assert (weights == 0).any()
    assert not torch.allclose(weights.sum(-1), torch.ones(1, 1, 6, dtype=torch.float64))


def test_grouped_query_heads_share_key_value_heads() -> None:
    q, k, v = randn(1, 4, 3, 2, seed=1), randn(1, 2, 3, 2, seed=2), randn(1, 2, 3, 2, seed=3)
    out = scaled_dot_product_attention(q, k, v)
    assert isinstance(out, Tensor)
    for head in range(4):  # query head i uses key/value head i // 2
        torch.testing.assert_close(out[:, head], naive(q[:, head], k[:, head // 2], v[:, head // 2]))


def test_invalid_arguments() -> None:
    q, k, v = randn(1, 2, 3, 4), randn(1, 2, 3, 4), randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="cannot return weights") as value_error, \
            pytest.warns(DeprecationWarning, match="use scaled_dot_product_attention_with_weights"):
        scaled_dot_product_attention(q, k, v, backend="sdpa", return_weights=True)
    assert str(value_error.value) == ("scaled_dot_product_attention: backend='sdpa' cannot return weights; "
                                      "use backend='reference'")
    # With checks off the annotation no longer refuses an unknown backend; the body still does.
    with shape_checks(False), pytest.raises(ValueError, match="backend must be") as value_error:
        scaled_dot_product_attention(q, k, v, backend="flash")  # type: ignore[call-overload]
    assert str(value_error.value) == ("scaled_dot_product_attention: backend must be 'reference' or 'sdpa', "
                                      "got 'flash'")
    with pytest.raises(ValueError, match="dropout_p"):
        scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    with pytest.raises(ShapeError) as info:
        scaled_dot_product_attention(q, k, v, backend="flash")  # type: ignore[call-overload]
    assert info.value.argument == "backend"
    with pytest.raises(ShapeError) as info:
        scaled_dot_product_attention(q, k.float(), v)
    assert info.value.summary.endswith("k: dtype is float32, expected float64 (the dtype of q)")
    with pytest.raises(ShapeError) as info:
        scaled_dot_product_attention(q, randn(1, 3, 3, 4), randn(1, 3, 3, 4))
    assert info.value.reason == "axis g is 3, which does not divide h=2 (bound by q)"
    assert (info.value.argument, info.value.axis, info.value.actual, info.value.bound_by) == ("k", "g", 3, "q")
    with pytest.raises(ShapeError) as info:  # 3-D masks are ambiguous ((b,t,s) or (h,t,s)): refused
        scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(1, 3, 3, dtype=torch.bool))
    assert info.value.argument == "attn_mask"


def test_sdpa_backend_with_a_zero_scale_and_is_causal_has_no_nan() -> None:
    # torch's CPU causal kernel returns NaN rows for scale <= 0; the sdpa backend must build the mask then.
    q, k, v = randn(1, 1, 3, 2, seed=1), randn(1, 1, 3, 2, seed=2), randn(1, 1, 3, 2, seed=3)
    for scale in (0.0, -1.0):
        out = scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, backend="sdpa")
        want = scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, backend="reference")
        torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_sdpa_backend_casts_a_float_mask_to_the_query_dtype() -> None:
    q, k, v = (randn(1, 2, 3, 4, seed=i, dtype=torch.float32) for i in range(3))
    bias = randn(3, 3, seed=5)  # float64 mask, float32 queries
    out = scaled_dot_product_attention(q, k, v, attn_mask=bias, backend="sdpa")
    want = scaled_dot_product_attention(q, k, v, attn_mask=bias.float(), backend="reference")
    torch.testing.assert_close(out, want)


def test_sdpa_backend_applies_dropout() -> None:
    q, k, v = (randn(2, 2, 16, 4, seed=i) for i in range(3))
    torch.manual_seed(0)
    dropped = scaled_dot_product_attention(q, k, v, dropout_p=0.5, backend="sdpa")
    plain = scaled_dot_product_attention(q, k, v, backend="sdpa")
    assert isinstance(dropped, Tensor)
    assert isinstance(plain, Tensor)
    assert not torch.allclose(dropped, plain)


# ---------------------------------------------------------------------------------------------------------
# attn_bias: an additive bias on the logits, beside the mask
# ---------------------------------------------------------------------------------------------------------


def naive_biased(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, keep: Tensor | None = None) -> Tensor:
    """softmax(q k^T / sqrt(d) + bias) v with plain matmuls, one explicit loop over heads."""
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    full_bias = bias.expand(full)
    for head in range(q.shape[1]):
        logits = q[:, head] @ k[:, head].transpose(-1, -2) / math.sqrt(q.shape[-1]) + full_bias[:, head]
        if keep is not None:
            logits = logits.masked_fill(~keep.expand(full)[:, head], float("-inf"))
        out[:, head] = logits.softmax(-1) @ v[:, head]
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bias_shape", [(4, 6), (1, 3, 4, 6), (2, 1, 1, 6), (2, 3, 4, 6)])
def test_attn_bias_is_added_to_the_scaled_logits(backend: Backend, bias_shape: tuple[int, ...]) -> None:
    q, k, v = randn(2, 3, 4, 5, seed=1), randn(2, 3, 6, 5, seed=2), randn(2, 3, 6, 7, seed=3)
    bias = randn(*bias_shape, seed=4)
    out = scaled_dot_product_attention(q, k, v, attn_bias=bias, backend=backend)
    torch.testing.assert_close(out, naive_biased(q, k, v, bias), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attn_bias_with_a_boolean_mask_and_causal_equals_torch_with_one_float_mask(backend: Backend) -> None:
    q, k, v = randn(2, 3, 4, 5, seed=1), randn(2, 3, 4, 5, seed=2), randn(2, 3, 4, 7, seed=3)
    bias = randn(1, 3, 4, 4, seed=4)
    keep = torch.rand(2, 1, 4, 4, generator=torch.Generator().manual_seed(5)) > 0.3
    keep[..., 0] = True  # every row keeps key 0, which causal keeps too: no fully masked row
    out = scaled_dot_product_attention(q, k, v, attn_mask=keep, attn_bias=bias, is_causal=True,
                                       backend=backend)
    allowed = keep & causal_mask(4)
    float_mask = bias.masked_fill(~allowed, float("-inf"))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, naive_biased(q, k, v, bias, allowed), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attn_bias_plus_a_float_mask_is_their_sum(backend: Backend) -> None:
    q, k, v = randn(1, 2, 3, 4, seed=1), randn(1, 2, 5, 4, seed=2), randn(1, 2, 5, 4, seed=3)
    bias, mask = randn(3, 5, seed=4), randn(1, 2, 3, 5, seed=5)
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask, attn_bias=bias, backend=backend)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask + bias)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_attn_bias_per_query_head_with_grouped_kv_heads_and_in_the_weights() -> None:
    q, k, v = randn(1, 4, 3, 4, seed=1), randn(1, 2, 3, 4, seed=2), randn(1, 2, 3, 4, seed=3)
    bias = randn(1, 4, 3, 3, seed=4)
    out, weights = scaled_dot_product_attention_with_weights(q, k, v, attn_bias=bias)
    expected = naive_biased(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), bias)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    logits = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) / 2.0 + bias
    torch.testing.assert_close(weights, logits.softmax(-1), rtol=1e-12, atol=1e-12)


def test_attn_bias_of_the_wrong_shape_or_dtype_is_a_shape_error() -> None:
    q, k, v = randn(1, 2, 3, 4, seed=1), randn(1, 2, 5, 4, seed=2), randn(1, 2, 5, 4, seed=3)
    with pytest.raises(ShapeError, match="attn_bias"):
        scaled_dot_product_attention(q, k, v, attn_bias=randn(3, 4))  # s is 5
    with pytest.raises(ShapeError, match="attn_bias"):
        scaled_dot_product_attention(q, k, v, attn_bias=randn(1, 3, 3, 5))  # h is 2
    with pytest.raises(ShapeError, match="attn_bias"):
        scaled_dot_product_attention(q, k, v, attn_bias=torch.ones(3, 5, dtype=torch.bool))
