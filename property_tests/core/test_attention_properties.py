"""Properties of ``typed_transformer.scaled_dot_product_attention`` (both backends).

References are independent of the library: ``torch.nn.functional.scaled_dot_product_attention`` (with
``enable_gqa`` and explicit bottom-right causal masks), masks built from their definitions, and
``einops.repeat`` for grouped-query heads.
"""

from dataclasses import dataclass
from typing import Literal

import pytest
import torch
import torch.nn.functional as F
from einops import repeat
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from tests.support.properties import (
    EXACTISH,
    HALF,
    HALF_FUSED,
    allow_diagonal,
    assert_close,
    bottom_right_causal,
    call_valid,
    fewer_examples,
    keep_of,
)
from typed_transformer import scaled_dot_product_attention, scaled_dot_product_attention_with_weights
from typed_transformer.strategies import (
    AttentionInputs,
    AttentionShape,
    attention_inputs,
    attention_shapes,
    attn_masks,
    float_dtypes,
    keep_masks,
    key_padding_masks,
    randn,
    seeds,
)

Backend = Literal["reference", "sdpa"]
BACKENDS: tuple[Backend, ...] = ("reference", "sdpa")


def attend(inputs: AttentionInputs, backend: Backend, *, attn_mask: Tensor | None = None, is_causal: bool = False,
           scale: float | None = None) -> Tensor:
    out = call_valid(scaled_dot_product_attention, inputs.q, inputs.k, inputs.v, attn_mask=attn_mask,
                     is_causal=is_causal, scale=scale, backend=backend)
    assert isinstance(out, Tensor)
    return out


def attend_with_weights(inputs: AttentionInputs, *, attn_mask: Tensor | None = None, is_causal: bool = False,
                        scale: float | None = None, dropout_p: float = 0.0) -> tuple[Tensor, Tensor]:
    return call_valid(scaled_dot_product_attention_with_weights, inputs.q, inputs.k, inputs.v, attn_mask=attn_mask,
                      is_causal=is_causal, scale=scale, dropout_p=dropout_p)


def combined_keep(shape: AttentionShape, mask: Tensor | None, is_causal: bool) -> Tensor:
    """The ``(b, h, t, s)`` keep-mask that ``mask`` and ``is_causal`` (bottom-right) describe together."""
    keep = torch.ones(shape.weights, dtype=torch.bool)
    mask_keep = keep_of(mask)
    if mask_keep is not None:
        keep = keep & mask_keep
    if is_causal:
        keep = keep & bottom_right_causal(shape.t, shape.s)
    return keep


def explicit_mask(shape: AttentionShape, mask: Tensor | None, is_causal: bool) -> Tensor | None:
    """``mask`` with an explicit bottom-right causal mask folded in (for torch, whose flag is top-left)."""
    if not is_causal:
        return mask
    causal = bottom_right_causal(shape.t, shape.s)
    if mask is None:
        return causal
    if mask.dtype == torch.bool:
        return mask & causal
    return mask.masked_fill(~causal, float("-inf"))


def torch_sdpa(inputs: AttentionInputs, mask: Tensor | None, is_causal: bool, scale: float | None,
               v: Tensor | None = None) -> Tensor:
    """torch's F.scaled_dot_product_attention on the same inputs. With ``t == s`` and no mask, torch's own
    ``is_causal`` (top-left, equal to bottom-right there) is used; otherwise an explicit mask.

    torch 2.13's CPU kernel returns NaN for ``is_causal=True`` with ``scale <= 0`` (the masked logits
    become ``-inf * scale``), so the reference uses the explicit mask for non-positive scales.
    """
    shape = inputs.shape
    value = inputs.v if v is None else v
    use_flag = is_causal and mask is None and shape.t == shape.s and (scale is None or scale > 0)
    torch_mask = None if use_flag else explicit_mask(shape, mask, is_causal)
    return F.scaled_dot_product_attention(inputs.q, inputs.k, value, attn_mask=torch_mask, is_causal=use_flag,
                                          scale=scale, enable_gqa=shape.g != shape.h)


@dataclass(frozen=True)
class CoreCase:
    inputs: AttentionInputs
    mask: Tensor | None
    is_causal: bool
    scale: float | None


@st.composite
def core_cases(
    draw: st.DrawFn,
    *,
    shapes: st.SearchStrategy[AttentionShape] | None = None,
    dtype: torch.dtype = torch.float64,
    causal: bool = True,
    fully_masked_rows: bool = False,
) -> CoreCase:
    """Inputs, an optional mask (bool or float, any layout), ``is_causal`` and ``scale``. Unless
    ``fully_masked_rows``, every query row that causality leaves a key keeps at least one key."""
    inputs = draw(attention_inputs(shapes, dtype=dtype))
    shape = inputs.shape
    is_causal = causal and draw(st.booleans(), label="is_causal")
    mask: Tensor | None = None
    if draw(st.booleans(), label="has_mask"):
        mask = draw(attn_masks(shape, dtype=dtype, fully_masked_rows=fully_masked_rows))
        if is_causal and not fully_masked_rows:
            mask = allow_diagonal(mask, shape.t, shape.s)
    scale = draw(st.none() | st.floats(-2.0, 2.0, allow_nan=False), label="scale")
    return CoreCase(inputs=inputs, mask=mask, is_causal=is_causal, scale=scale)


# ----------------------------------------------------------------------------------------------------
# a. Shapes and dtypes
# ----------------------------------------------------------------------------------------------------


@given(data=st.data(), dtype=float_dtypes(), backend=st.sampled_from(BACKENDS))
def test_output_shape_and_dtype(data: st.DataObject, dtype: torch.dtype, backend: Backend) -> None:
    case = data.draw(core_cases(dtype=dtype, fully_masked_rows=True))
    shape = case.inputs.shape
    out = attend(case.inputs, backend, attn_mask=case.mask, is_causal=case.is_causal, scale=case.scale)
    assert out.shape == shape.out
    assert out.dtype == dtype
    if backend == "reference":
        out2, weights = attend_with_weights(case.inputs, attn_mask=case.mask, is_causal=case.is_causal,
                                            scale=case.scale)
        assert out2.shape == shape.out
        assert out2.dtype == dtype
        assert weights.shape == shape.weights
        assert weights.dtype == dtype
        assert torch.equal(out, out2)


@given(data=st.data(), dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
       backend=st.sampled_from(BACKENDS))
def test_low_precision_matches_float32_computation(data: st.DataObject, dtype: torch.dtype, backend: Backend) -> None:
    """Half/bf16 inputs: the result is the float32 computation (of the same rounded inputs) rounded once
    (to within torch's own rounding of the weights on the sdpa backend)."""
    case = data.draw(core_cases(dtype=dtype))
    inputs = case.inputs
    out = attend(inputs, backend, attn_mask=case.mask, is_causal=case.is_causal, scale=case.scale)
    upcast = AttentionInputs(inputs.shape, inputs.q.float(), inputs.k.float(), inputs.v.float(), inputs.seed)
    mask = case.mask if case.mask is None or case.mask.dtype == torch.bool else case.mask.float()
    expected = torch_sdpa(upcast, mask, case.is_causal, case.scale)
    live = combined_keep(inputs.shape, mask, case.is_causal).any(-1, keepdim=True)
    expected = torch.where(live, expected, 0.0).to(dtype)
    assert out.dtype == dtype
    assert_close(out.float(), expected.float(), (HALF if backend == "reference" else HALF_FUSED)[dtype])


# ----------------------------------------------------------------------------------------------------
# b. Equivalence with torch's F.scaled_dot_product_attention
# ----------------------------------------------------------------------------------------------------


@given(case=core_cases(), backend=st.sampled_from(BACKENDS))
def test_matches_torch_sdpa(case: CoreCase, backend: Backend) -> None:
    """float64, GQA (enable_gqa), bool and float masks in every layout, ``scale``, bottom-right causal.
    Query rows that the causal mask leaves without keys (t > s) must be exactly zero."""
    inputs, shape = case.inputs, case.inputs.shape
    out = attend(inputs, backend, attn_mask=case.mask, is_causal=case.is_causal, scale=case.scale)
    live = combined_keep(shape, case.mask, case.is_causal).any(-1, keepdim=True)
    expected = torch.where(live, torch_sdpa(inputs, case.mask, case.is_causal, case.scale), 0.0)
    assert_close(out, expected)


@given(case=core_cases())
def test_weights_match_torch_sdpa(case: CoreCase) -> None:
    """Returned weights equal torch's attention applied to identity values (``softmax(...) @ I``)."""
    inputs, shape = case.inputs, case.inputs.shape
    out, weights = attend_with_weights(inputs, attn_mask=case.mask, is_causal=case.is_causal, scale=case.scale)
    eye = torch.eye(shape.s, dtype=torch.float64).expand(shape.b, shape.g, shape.s, shape.s)
    live = combined_keep(shape, case.mask, case.is_causal).any(-1, keepdim=True)
    expected = torch.where(live, torch_sdpa(inputs, case.mask, case.is_causal, case.scale, v=eye), 0.0)
    assert_close(weights, expected)
    assert_close(out, weights @ inputs.v.repeat_interleave(shape.r, dim=1))


@given(case=core_cases(), backend=st.sampled_from(BACKENDS), seed=seeds(), data=st.data())
def test_attn_bias_equals_torch_sdpa_with_the_bias_in_its_float_mask(case: CoreCase, backend: Backend, seed: int,
                                                                    data: st.DataObject) -> None:
    """``attn_bias`` (2-D or 4-D, any broadcast) beside any mask and ``is_causal``: torch's one float mask,
    the bias with ``-inf`` where our masks forbid (or the bias plus a float mask), gives the same output."""
    inputs, shape = case.inputs, case.inputs.shape
    if data.draw(st.booleans(), label="two_dimensional"):
        bias_shape: tuple[int, ...] = (shape.t, shape.s)
    else:
        axes = (("b", shape.b), ("h", shape.h), ("t", shape.t))
        bias_shape = (*(data.draw(st.sampled_from([1, n]), label=axis) for axis, n in axes), shape.s)
    bias = randn(bias_shape, seed)
    out = call_valid(scaled_dot_product_attention, inputs.q, inputs.k, inputs.v, attn_mask=case.mask,
                     attn_bias=bias, is_causal=case.is_causal, scale=case.scale, backend=backend)
    assert isinstance(out, Tensor)
    mask = explicit_mask(shape, case.mask, case.is_causal)
    if mask is None:
        torch_mask = bias
    elif mask.dtype == torch.bool:
        torch_mask = torch.where(mask, bias, float("-inf"))
    else:
        torch_mask = mask + bias
    live = combined_keep(shape, case.mask, case.is_causal).any(-1, keepdim=True)
    expected = F.scaled_dot_product_attention(inputs.q, inputs.k, inputs.v, attn_mask=torch_mask, scale=case.scale,
                                              enable_gqa=shape.g != shape.h)
    assert_close(out, torch.where(live, expected, 0.0))


@given(inputs=attention_inputs(attention_shapes(same_length=True)), backend=st.sampled_from(BACKENDS),
       scale=st.none() | st.floats(-2.0, 2.0, allow_nan=False))
def test_is_causal_equals_torch_when_square(inputs: AttentionInputs, backend: Backend, scale: float | None) -> None:
    """With t == s torch's top-left ``is_causal`` equals our bottom-right one (for any ``scale``)."""
    out = attend(inputs, backend, is_causal=True, scale=scale)
    assert_close(out, torch_sdpa(inputs, None, True, scale))


# ----------------------------------------------------------------------------------------------------
# c. Causality
# ----------------------------------------------------------------------------------------------------


@given(inputs=attention_inputs(), backend=st.sampled_from(BACKENDS), data=st.data())
def test_causal_perturbing_future_keys_leaves_earlier_queries(inputs: AttentionInputs, backend: Backend,
                                                              data: st.DataObject) -> None:
    """Query ``i`` sees keys ``j <= i + (s - t)`` (bottom-right): changing the keys and values after that
    leaves rows ``<= i`` unchanged. With ``t < s`` (a KV cache) the offset is positive."""
    shape = inputs.shape
    i = data.draw(st.integers(0, shape.t - 1), label="query")
    first_hidden = max(i + shape.s - shape.t + 1, 0)
    k, v = inputs.k.clone(), inputs.v.clone()
    k[:, :, first_hidden:] = randn(k[:, :, first_hidden:].shape, inputs.seed + 1) * 10
    v[:, :, first_hidden:] = randn(v[:, :, first_hidden:].shape, inputs.seed + 2) * 10
    perturbed = AttentionInputs(shape, inputs.q, k, v, inputs.seed)
    before = attend(inputs, backend, is_causal=True)
    after = attend(perturbed, backend, is_causal=True)
    assert_close(after[:, :, : i + 1], before[:, :, : i + 1], EXACTISH)


@given(inputs=attention_inputs(), backend=st.sampled_from(BACKENDS))
def test_causal_gradient_is_zero_for_future_keys(inputs: AttentionInputs, backend: Backend) -> None:
    """d out[i] / d k[j] and d out[i] / d v[j] vanish exactly for every j > i + (s - t), and d out[i] / d v[j]
    is non-zero for every visible key j (each visible key gets a positive weight)."""
    shape = inputs.shape
    q, k, v = (x.clone().requires_grad_(True) for x in (inputs.q, inputs.k, inputs.v))
    out = attend(AttentionInputs(shape, q, k, v, inputs.seed), backend, is_causal=True)
    for i in range(shape.t):
        grad_k, grad_v = torch.autograd.grad(out[:, :, i].sum(), (k, v), retain_graph=True)
        horizon = i + shape.s - shape.t  # last visible key
        first_hidden = max(horizon + 1, 0)
        assert torch.all(grad_k[:, :, first_hidden:] == 0)
        assert torch.all(grad_v[:, :, first_hidden:] == 0)
        if horizon >= 0:
            assert torch.all(grad_v[:, :, : horizon + 1].abs().sum(-1) > 0)


# ----------------------------------------------------------------------------------------------------
# d. Invariances and structural properties
# ----------------------------------------------------------------------------------------------------


@given(case=core_cases(fully_masked_rows=True), backend=st.sampled_from(BACKENDS))
def test_batch_elements_are_independent(case: CoreCase, backend: Backend) -> None:
    inputs, shape = case.inputs, case.inputs.shape
    out = attend(inputs, backend, attn_mask=case.mask, is_causal=case.is_causal, scale=case.scale)
    for i in range(shape.b):
        one = AttentionInputs(shape, inputs.q[i : i + 1], inputs.k[i : i + 1], inputs.v[i : i + 1], inputs.seed)
        mask = case.mask
        if mask is not None and mask.ndim == 4 and mask.shape[0] > 1:
            mask = mask[i : i + 1]
        single = attend(one, backend, attn_mask=mask, is_causal=case.is_causal, scale=case.scale)
        assert_close(out[i : i + 1], single, EXACTISH)


@given(case=core_cases(causal=False, fully_masked_rows=True), backend=st.sampled_from(BACKENDS), data=st.data())
def test_joint_key_value_permutation_invariance(case: CoreCase, backend: Backend, data: st.DataObject) -> None:
    """Permuting key/value positions (and the mask's key axis) together leaves the output unchanged;
    permuting query positions (and the mask's query axis) permutes the output the same way."""
    inputs, shape = case.inputs, case.inputs.shape
    key_perm = torch.tensor(data.draw(st.permutations(range(shape.s)), label="key_perm"))
    query_perm = torch.tensor(data.draw(st.permutations(range(shape.t)), label="query_perm"))
    out = attend(inputs, backend, attn_mask=case.mask, scale=case.scale)
    permuted = AttentionInputs(shape, inputs.q[:, :, query_perm], inputs.k[:, :, key_perm], inputs.v[:, :, key_perm],
                               inputs.seed)
    mask = None if case.mask is None else case.mask[..., key_perm][..., query_perm, :]
    out_permuted = attend(permuted, backend, attn_mask=mask, scale=case.scale)
    assert_close(out_permuted, out[:, :, query_perm], EXACTISH)


@given(inputs=attention_inputs(), backend=st.sampled_from(BACKENDS), data=st.data())
def test_key_padding_equals_truncation(inputs: AttentionInputs, backend: Backend, data: st.DataObject) -> None:
    """Masking padded keys gives the output of attending to the real keys only, whatever junk the padded
    positions hold."""
    shape = inputs.shape
    real = data.draw(key_padding_masks(shape.b, shape.s), label="real")
    as_float = data.draw(st.booleans(), label="float_mask")
    mask = real[:, None, None, :].expand(shape.b, 1, shape.t, shape.s)  # the core takes t explicitly
    attn_mask = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf")) if as_float else mask
    junk_k = torch.where(real[:, None, :, None], inputs.k, 1e3 * randn(inputs.k.shape, inputs.seed + 1))
    junk_v = torch.where(real[:, None, :, None], inputs.v, 1e3 * randn(inputs.v.shape, inputs.seed + 2))
    out = attend(AttentionInputs(shape, inputs.q, junk_k, junk_v, inputs.seed), backend, attn_mask=attn_mask)
    for i in range(shape.b):
        keys = real[i]
        truncated = AttentionInputs(shape, inputs.q[i : i + 1], inputs.k[i : i + 1, :, keys],
                                    inputs.v[i : i + 1, :, keys], inputs.seed)
        assert_close(out[i : i + 1], attend(truncated, backend), EXACTISH)


@given(case=core_cases(fully_masked_rows=True))
def test_weights_are_distributions(case: CoreCase) -> None:
    """Weights are >= 0; a row sums to 1 when some key is allowed and is exactly 0 when none is."""
    shape = case.inputs.shape
    _, weights = attend_with_weights(case.inputs, attn_mask=case.mask, is_causal=case.is_causal, scale=case.scale)
    keep = combined_keep(shape, case.mask, case.is_causal)
    live = keep.any(-1)
    assert torch.all(weights >= 0)
    assert torch.all(weights[~keep] == 0)
    assert_close(weights.sum(-1)[live], torch.ones_like(weights.sum(-1)[live]), EXACTISH)
    assert torch.all(weights[~live] == 0)


@given(inputs=attention_inputs(), backend=st.sampled_from(BACKENDS), data=st.data())
def test_fully_masked_rows_give_zero_output_and_zero_gradient(inputs: AttentionInputs, backend: Backend,
                                                              data: st.DataObject) -> None:
    shape = inputs.shape
    as_float = data.draw(st.booleans(), label="float_mask")
    keep = data.draw(keep_masks(shape.weights, fully_masked_rows=True), label="keep")
    dead_row = data.draw(st.integers(0, shape.t - 1), label="dead_row")
    keep[:, :, dead_row] = False
    mask = torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, float("-inf")) if as_float else keep
    q, k, v = (x.clone().requires_grad_(True) for x in (inputs.q, inputs.k, inputs.v))
    out = attend(AttentionInputs(shape, q, k, v, inputs.seed), backend, attn_mask=mask)
    dead = ~keep.any(-1)
    assert torch.all(out[dead] == 0)
    # A loss on the dead rows only has zero gradient everywhere; a loss on every row has finite gradients.
    weights = randn(out.shape, inputs.seed + 1)
    dead_grads = torch.autograd.grad((out * weights * dead[..., None]).sum(), (q, k, v), retain_graph=True)
    for grad in dead_grads:
        assert torch.all(grad == 0)
    all_grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
    for grad in all_grads:
        assert torch.all(torch.isfinite(grad))
    assert torch.all(all_grads[0][dead] == 0)


@given(case=core_cases(fully_masked_rows=True), backend=st.sampled_from(BACKENDS))
def test_grouped_query_equals_repeated_kv_heads(case: CoreCase, backend: Backend) -> None:
    """Query head i uses kv head i // r: the same as repeating every kv head r times (einops)."""
    inputs, shape = case.inputs, case.inputs.shape
    out = attend(inputs, backend, attn_mask=case.mask, is_causal=case.is_causal, scale=case.scale)
    k = repeat(inputs.k, "b g s d -> b (g r) s d", r=shape.r)
    v = repeat(inputs.v, "b g s d -> b (g r) s d", r=shape.r)
    full = AttentionInputs(shape, inputs.q, k, v, inputs.seed)
    assert_close(out, attend(full, backend, attn_mask=case.mask, is_causal=case.is_causal, scale=case.scale), EXACTISH)


@fewer_examples(3)
@given(
    case=core_cases(shapes=attention_shapes(max_batch=2, max_len=3, max_kv_heads=2, max_group=2, max_head_dim=3,
                                            max_value_dim=3), fully_masked_rows=True),
    backend=st.sampled_from(BACKENDS),
)
def test_gradcheck(case: CoreCase, backend: Backend) -> None:
    inputs = case.inputs
    tensors = tuple(x.clone().requires_grad_(True) for x in (inputs.q, inputs.k, inputs.v))

    def fn(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return attend(AttentionInputs(inputs.shape, q, k, v, inputs.seed), backend, attn_mask=case.mask,
                      is_causal=case.is_causal, scale=case.scale)

    assert torch.autograd.gradcheck(fn, tensors, eps=1e-6, atol=1e-5, rtol=1e-4)


@given(case=core_cases(fully_masked_rows=True), backend=st.sampled_from(BACKENDS))
def test_deterministic(case: CoreCase, backend: Backend) -> None:
    first = attend(case.inputs, backend, attn_mask=case.mask, is_causal=case.is_causal, scale=case.scale)
    second = attend(case.inputs, backend, attn_mask=case.mask, is_causal=case.is_causal, scale=case.scale)
    assert torch.equal(first, second)


@given(case=core_cases(), p=st.sampled_from([0.5, 0.1, 0.9]))
def test_dropout_zeroes_or_rescales_weights(case: CoreCase, p: float) -> None:
    """With dropout every weight is either dropped (0) or the undropped weight divided by 1 - p, and the
    output is computed from the dropped-out weights."""
    inputs, shape = case.inputs, case.inputs.shape
    _, clean = attend_with_weights(inputs, attn_mask=case.mask, is_causal=case.is_causal, scale=case.scale)
    out, dropped = attend_with_weights(inputs, attn_mask=case.mask, is_causal=case.is_causal, scale=case.scale,
                                       dropout_p=p)
    kept = dropped != 0
    assert_close(dropped[kept], clean[kept] / (1 - p), EXACTISH)
    assert_close(out, dropped @ inputs.v.repeat_interleave(shape.r, dim=1), EXACTISH)


@pytest.mark.parametrize("backend", BACKENDS)
@given(inputs=attention_inputs())
def test_scale_default_is_inverse_sqrt_head_size(backend: Backend, inputs: AttentionInputs) -> None:
    """``scale=None`` means ``1 / sqrt(d)``; an explicit scale is honoured (checked against torch above)."""
    d = inputs.shape.d
    assert_close(attend(inputs, backend), attend(inputs, backend, scale=d**-0.5), EXACTISH)
