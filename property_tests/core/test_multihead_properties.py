"""Properties of ``typed_transformer.MultiHeadAttention``.

The main reference is ``torch.nn.MultiheadAttention`` itself (weights copied with ``from_torch``), in
float64, eval mode, dropout 0, with torch's fast path both off and on. Masks for torch are built by hand
from ours (inverted booleans, ``((b h), t, s)`` batch-major 3-D layout, explicit bottom-right causal
mask), except for the torch-native 3-D layout, which goes through ``attn_mask_from_torch``.
"""

import contextlib
from dataclasses import dataclass
from typing import Literal

import pytest
import torch
from einops import rearrange, repeat
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor, nn

from tests.support.properties import (
    EXACTISH,
    assert_close,
    bottom_right_causal,
    call_valid,
    count_native_mha_calls,
    fewer_examples,
    mha_fastpath,
    more_examples,
)
from typed_transformer import (
    MultiHeadAttention,
    attn_mask_from_torch,
    attn_mask_to_torch,
    from_torch,
    key_padding_mask_from_torch,
    key_padding_mask_to_torch,
    to_torch,
)
from typed_transformer.strategies import (
    MHAConfig,
    additive_masks,
    float_dtypes,
    keep_masks,
    key_padding_masks,
    mha_configs,
    randn,
    randomize_parameters,
    seeds,
)

Backend = Literal["reference", "sdpa"]
BACKENDS: tuple[Backend, ...] = ("reference", "sdpa")
MaskLayout = Literal["t s", "b t s", "b h t s", "1 h t s", "b 1 t s", "1 1 t s", "torch (b h) t s"]
MASK_LAYOUTS: tuple[MaskLayout, ...] = ("t s", "b t s", "b h t s", "1 h t s", "b 1 t s", "1 1 t s",
                                        "torch (b h) t s")


# ----------------------------------------------------------------------------------------------------
# Cases: a configuration, inputs, our masks and the equivalent torch masks
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MHACase:
    config: MHAConfig
    b: int
    t: int
    s: int
    query: Tensor
    key: Tensor | None  # None: self-attention (torch gets query as key and value)
    value: Tensor | None
    attn_mask: Tensor | None  # ours: True = may attend, or additive float
    key_padding_mask: Tensor | None  # ours: True = real token
    is_causal: bool
    torch_attn_mask: Tensor | None  # torch's: True = masked out, or additive float; causal folded in
    torch_key_padding_mask: Tensor | None  # torch's: True = padding, or additive float
    seed: int

    def call(self, module: MultiHeadAttention, *, need_weights: bool = False, average: bool = True,
             explicit_self: bool = False) -> tuple[Tensor, Tensor | None]:
        """Our module on this case (``explicit_self``: pass the query as key and value)."""
        key, value = self.key, self.value
        if key is None and explicit_self:
            key = value = self.query
        return _ours(module, self.query, key, value, attn_mask=self.attn_mask,
                     key_padding_mask=self.key_padding_mask, is_causal=self.is_causal, need_weights=need_weights,
                     average_attn_weights=average)


def _ours_to_torch_attn_mask(mask: Tensor, b: int, h: int, layout: MaskLayout) -> Tensor:
    """By hand: invert booleans, lay 3-D and 4-D masks out as torch's ``((b h), t, s)``."""
    torch_mask = ~mask if mask.dtype == torch.bool else mask
    if layout == "t s":
        return torch_mask
    if layout == "b t s":
        return repeat(torch_mask, "b t s -> (b h) t s", h=h)
    full = torch_mask.expand(b, h, *torch_mask.shape[-2:])
    return rearrange(full, "b h t s -> (b h) t s")


def _layout_shape(layout: MaskLayout, b: int, h: int, t: int, s: int) -> tuple[int, ...]:
    if layout == "torch (b h) t s":
        return (b * h, t, s)
    sizes = {"b": b, "h": h, "t": t, "s": s, "1": 1}
    return tuple(sizes[axis] for axis in layout.split())


def _fold_causal(torch_mask: Tensor | None, t: int, s: int, as_float: bool) -> Tensor:
    """Fold a bottom-right causal mask into a torch-convention mask (torch's MHA has no usable flag)."""
    hidden = ~bottom_right_causal(t, s)
    if torch_mask is None:
        return torch.zeros(t, s, dtype=torch.float64).masked_fill(hidden, float("-inf")) if as_float else hidden
    if torch_mask.dtype == torch.bool:
        return torch_mask | hidden
    return torch_mask.masked_fill(hidden, float("-inf"))


@st.composite
def mha_cases(
    draw: st.DrawFn,
    *,
    configs: st.SearchStrategy[MHAConfig] | None = None,
    self_attention: bool | None = None,
    masks: bool = True,
    float_masks: bool = True,
    causal: bool = True,
    max_batch: int = 3,
    max_len: int = 6,
) -> MHACase:
    """A case that torch can run: float64 inputs, masks that leave every query row at least one key
    (unless appended bias_k/zero keys are always there), torch-convention copies of the masks."""
    if self_attention is None:
        self_attention = draw(st.booleans(), label="self_attention")
    config = draw(mha_configs(torch_compatible=True, self_attention=self_attention) if configs is None else configs)
    b = draw(st.integers(1, max_batch), label="b")
    t = draw(st.integers(1, max_len), label="t")
    s = t if self_attention else draw(st.integers(1, max_len), label="s")
    seed = draw(seeds(), label="seed")
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(b, t, config.query_width, generator=generator, dtype=torch.float64)
    key = value = None
    if not self_attention:
        key = torch.randn(b, s, config.key_width, generator=generator, dtype=torch.float64)
        value = torch.randn(b, s, config.value_width, generator=generator, dtype=torch.float64)

    h = config.num_heads
    has_extra = config.extra_keys > 0
    # Without appended keys, torch gives NaN for a query row with no key: keep one key (the anchor)
    # allowed in every row by every mask. Under causality the anchor must be visible to row 0.
    is_causal = causal and (t <= s or has_extra) and draw(st.booleans(), label="is_causal")
    anchor = None
    if not has_extra:
        anchor = draw(st.integers(0, s - t if is_causal else s - 1), label="anchor")

    attn_mask = torch_attn_mask = None
    kind = draw(st.sampled_from(["none", "bool", "float"] if float_masks else ["none", "bool"]),
                label="mask_kind") if masks else "none"
    if kind != "none":
        layout = draw(st.sampled_from(MASK_LAYOUTS), label="layout")
        shape = _layout_shape(layout, b, h, t, s)
        if kind == "bool":
            mask = draw(keep_masks(shape, fully_masked_rows=has_extra, always_keep=anchor))
        else:
            mask = draw(additive_masks(shape, fully_masked_rows=has_extra, always_keep=anchor))
        if layout == "torch (b h) t s":
            torch_attn_mask = ~mask if kind == "bool" else mask
            attn_mask = attn_mask_from_torch(torch_attn_mask, h)
        else:
            attn_mask = mask
            torch_attn_mask = _ours_to_torch_attn_mask(mask, b, h, layout)

    key_padding_mask = torch_key_padding_mask = None
    if masks and draw(st.booleans(), label="has_key_padding_mask"):
        key_padding_mask = draw(key_padding_masks(b, s, fully_padded_rows=has_extra, always_keep=anchor))
        if kind == "float":  # torch deprecates mixing a bool padding mask with a float attn_mask
            torch_key_padding_mask = torch.zeros(b, s, dtype=torch.float64).masked_fill(~key_padding_mask,
                                                                                          float("-inf"))
        else:
            torch_key_padding_mask = ~key_padding_mask
    if is_causal:
        torch_attn_mask = _fold_causal(torch_attn_mask, t, s, as_float=kind == "float")
    return MHACase(config=config, b=b, t=t, s=s, query=query, key=key, value=value, attn_mask=attn_mask,
                   key_padding_mask=key_padding_mask, is_causal=is_causal, torch_attn_mask=torch_attn_mask,
                   torch_key_padding_mask=torch_key_padding_mask, seed=seed)


def torch_module(case: MHACase, *, batch_first: bool = True, dropout: float = 0.0) -> nn.MultiheadAttention:
    config = case.config
    module = nn.MultiheadAttention(config.d_model, config.num_heads, dropout=dropout, batch_first=batch_first,
                                   dtype=torch.float64, **config.torch_kwargs())
    randomize_parameters(module, case.seed + 1)
    return module.eval()


def run_torch(module: nn.MultiheadAttention, case: MHACase, *, need_weights: bool,
              average: bool) -> tuple[Tensor, Tensor | None]:
    batch_first = module.batch_first
    query = case.query if batch_first else case.query.transpose(0, 1)
    if case.key is None:
        key = value = query  # the same object: torch's fast path needs `query is key is value`
    else:
        assert case.value is not None
        key = case.key if batch_first else case.key.transpose(0, 1)
        value = case.value if batch_first else case.value.transpose(0, 1)
    out, weights = module(query, key, value, attn_mask=case.torch_attn_mask,
                          key_padding_mask=case.torch_key_padding_mask, need_weights=need_weights,
                          average_attn_weights=average)
    return (out if batch_first else out.transpose(0, 1)), weights


def _ours(module: MultiHeadAttention, *args: Tensor | None, **kwargs: object) -> tuple[Tensor, Tensor | None]:
    """Our module on arguments it must accept (an unexpected ShapeError fails the test)."""
    result: tuple[Tensor, Tensor | None] = call_valid(module, *args, **kwargs)  # type: ignore[arg-type]
    return result


# ----------------------------------------------------------------------------------------------------
# a. Shapes and dtypes
# ----------------------------------------------------------------------------------------------------


@given(config=mha_configs(), dtype=float_dtypes(), backend=st.sampled_from(BACKENDS), need_weights=st.booleans(),
       average=st.booleans(), self_attention=st.booleans(), is_causal=st.booleans(),
       b=st.integers(1, 3), t=st.integers(1, 6), s=st.integers(1, 6), seed=seeds())
def test_output_shapes_and_dtypes(config: MHAConfig, dtype: torch.dtype, backend: Backend, need_weights: bool,
                                  average: bool, self_attention: bool, is_causal: bool, b: int, t: int, s: int,
                                  seed: int) -> None:
    """Every configuration (grouped-query heads, query width != d_model, kdim/vdim, bias_kv, zero attn)."""
    self_attention = self_attention and config.key_width == config.query_width == config.value_width
    module = MultiHeadAttention(config.d_model, config.num_heads, backend=backend, dtype=dtype, **config.kwargs())
    query = randn((b, t, config.query_width), seed, dtype=dtype)
    if self_attention:
        s = t
        key = value = None
    else:
        key = randn((b, s, config.key_width), seed + 1, dtype=dtype)
        value = randn((b, s, config.value_width), seed + 2, dtype=dtype)
    out, weights = _ours(module, query, key, value, is_causal=is_causal, need_weights=need_weights,
                         average_attn_weights=average)
    assert out.shape == (b, t, config.d_model)
    assert out.dtype == dtype
    s_total = s + config.extra_keys
    if not need_weights:
        assert weights is None
    else:
        assert weights is not None
        assert weights.shape == ((b, t, s_total) if average else (b, config.num_heads, t, s_total))
        assert weights.dtype == dtype


# ----------------------------------------------------------------------------------------------------
# b. Equivalence with torch.nn.MultiheadAttention
# ----------------------------------------------------------------------------------------------------


@more_examples(3)
@given(case=mha_cases(), batch_first=st.booleans(), fastpath=st.booleans(), need_weights=st.booleans(),
       average=st.booleans(), backend=st.sampled_from(BACKENDS), explicit_self=st.booleans())
def test_matches_torch_mha(case: MHACase, batch_first: bool, fastpath: bool, need_weights: bool, average: bool,
                           backend: Backend, explicit_self: bool) -> None:
    """All constructor options torch has, every mask kind and layout, key padding, causal, both
    ``need_weights`` and ``average_attn_weights``, ``batch_first`` either way, torch's fast path on/off."""
    reference = torch_module(case, batch_first=batch_first)
    ours = from_torch(reference, backend=backend)
    grad_mode = torch.no_grad() if fastpath else contextlib.nullcontext()  # the fast path needs no_grad
    with mha_fastpath(fastpath), grad_mode:
        want_out, want_weights = run_torch(reference, case, need_weights=need_weights, average=average)
    got_out, got_weights = case.call(ours, need_weights=need_weights, average=average, explicit_self=explicit_self)
    assert_close(got_out, want_out)
    if need_weights:
        assert got_weights is not None
        assert want_weights is not None
        assert_close(got_weights, want_weights)
    else:
        assert got_weights is None


@given(case=mha_cases(configs=mha_configs(torch_compatible=True, self_attention=True, even_heads=True,
                                          extras=False).filter(lambda c: c.bias),
                      self_attention=True, float_masks=False),
       need_weights=st.booleans(), average=st.booleans(), backend=st.sampled_from(BACKENDS))
def test_matches_torch_mha_fast_path(case: MHACase, need_weights: bool, average: bool, backend: Backend) -> None:
    """Self-attention in eval + no_grad with even heads, bias and bool masks: torch takes its fused fast
    path (asserted by counting calls of ``torch._native_multi_head_attention``)."""
    reference = torch_module(case, batch_first=True)
    ours = from_torch(reference, backend=backend).eval()
    with mha_fastpath(True), torch.no_grad(), count_native_mha_calls() as calls:
        want_out, want_weights = run_torch(reference, case, need_weights=need_weights, average=average)
        got_out, got_weights = case.call(ours, need_weights=need_weights, average=average)
    assert calls, "torch did not take its fast path: the test does not test what it says"
    assert_close(got_out, want_out)
    if need_weights:
        assert got_weights is not None
        assert want_weights is not None
        assert_close(got_weights, want_weights)


@given(case=mha_cases(masks=False), batch_first=st.booleans(), backend=st.sampled_from(BACKENDS))
def test_to_torch_round_trip(case: MHACase, batch_first: bool, backend: Backend) -> None:
    """``to_torch`` gives an equivalent torch module; ``from_torch(to_torch(m))`` has the same parameters."""
    config = case.config
    ours = MultiHeadAttention(config.d_model, config.num_heads, backend=backend, dtype=torch.float64,
                              **config.kwargs())
    randomize_parameters(ours, case.seed + 1)
    ours.eval()
    theirs = to_torch(ours, batch_first=batch_first)
    assert theirs.batch_first == batch_first
    assert not theirs.training
    with mha_fastpath(False):
        want_out, want_weights = run_torch(theirs, case, need_weights=True, average=False)
    got_out, got_weights = case.call(ours, need_weights=True, average=False)
    assert_close(got_out, want_out)
    assert got_weights is not None
    assert want_weights is not None
    assert_close(got_weights, want_weights)
    back = from_torch(theirs, backend=backend)
    assert back.state_dict().keys() == ours.state_dict().keys()
    for name, tensor in ours.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


@given(config=mha_configs(self_attention=True).filter(lambda c: c.input_dim is None),
       b=st.integers(1, 3), t=st.integers(1, 6), is_causal=st.booleans(), need_weights=st.booleans(),
       backend=st.sampled_from(BACKENDS), seed=seeds())
def test_grouped_query_matches_torch_with_repeated_kv_weights(config: MHAConfig, b: int, t: int, is_causal: bool,
                                                              need_weights: bool, backend: Backend, seed: int) -> None:
    """Grouped-query attention equals torch's MHA whose k/v projections repeat each kv head's rows for
    the r query heads that share it (query head i uses kv head i // r)."""
    ours = MultiHeadAttention(config.d_model, config.num_heads, backend=backend, dtype=torch.float64,
                              **config.kwargs())
    randomize_parameters(ours, seed)
    h, g, d = config.num_heads, config.num_kv_heads, config.head_dim
    reference = nn.MultiheadAttention(config.d_model, h, bias=config.bias, add_bias_kv=config.add_bias_kv,
                                      add_zero_attn=config.add_zero_attn, batch_first=True, dtype=torch.float64)

    def expand(rows: Tensor) -> Tensor:  # (g d) ... -> (g r d) ...
        return repeat(rows, "(g d) ... -> (g r d) ...", g=g, d=d, r=h // g)

    assert ours.in_proj is not None
    with torch.no_grad():
        wq, wk, wv = torch.split(ours.in_proj.weight, [config.d_model, g * d, g * d])
        reference.in_proj_weight.copy_(torch.cat([wq, expand(wk), expand(wv)]))
        if config.bias:
            assert ours.in_proj.bias is not None
            bq, bk, bv = torch.split(ours.in_proj.bias, [config.d_model, g * d, g * d])
            reference.in_proj_bias.copy_(torch.cat([bq, expand(bk), expand(bv)]))
            reference.out_proj.bias.copy_(ours.out_proj.bias)
        reference.out_proj.weight.copy_(ours.out_proj.weight)
        if config.add_bias_kv:
            assert ours.bias_k is not None
            assert ours.bias_v is not None
            assert reference.bias_k is not None
            assert reference.bias_v is not None
            reference.bias_k.copy_(expand(ours.bias_k).reshape(1, 1, -1))
            reference.bias_v.copy_(expand(ours.bias_v).reshape(1, 1, -1))
    reference.eval()
    x = randn((b, t, config.d_model), seed + 1)
    torch_mask = _fold_causal(None, t, t, as_float=False) if is_causal else None
    with mha_fastpath(False):
        want_out, want_weights = reference(x, x, x, attn_mask=torch_mask, need_weights=need_weights,
                                           average_attn_weights=False)
    got_out, got_weights = _ours(ours, x, is_causal=is_causal, need_weights=need_weights, average_attn_weights=False)
    assert_close(got_out, want_out)
    if need_weights:
        assert got_weights is not None
        assert want_weights is not None
        assert_close(got_weights, want_weights)


@given(b=st.integers(1, 3), t=st.integers(1, 6), s=st.integers(1, 6), h=st.integers(1, 3),
       as_float=st.booleans(), three_d=st.booleans(), seed=seeds())
def test_mask_converters_round_trip(b: int, t: int, s: int, h: int, as_float: bool, three_d: bool,
                                    seed: int) -> None:
    """``*_to_torch`` inverts ``*_from_torch``; booleans flip polarity; 3-D torch masks are batch-major."""
    shape = (b * h, t, s) if three_d else (t, s)
    values = randn(shape, seed)
    torch_mask = values if as_float else values > 0
    ours = attn_mask_from_torch(torch_mask, h)
    if three_d:
        assert ours.shape == (b, h, t, s)
        for i in range(b):
            for j in range(h):  # torch's index is batch * num_heads + head
                expected = torch_mask[i * h + j] if as_float else ~torch_mask[i * h + j]
                assert torch.equal(ours[i, j], expected)
    else:
        assert torch.equal(ours, torch_mask if as_float else ~torch_mask)
    assert torch.equal(attn_mask_to_torch(ours), torch_mask)
    padding = randn((b, s), seed + 1) > 0
    assert torch.equal(key_padding_mask_from_torch(padding), ~padding)
    assert torch.equal(key_padding_mask_to_torch(key_padding_mask_from_torch(padding)), padding)


# ----------------------------------------------------------------------------------------------------
# c. Causality
# ----------------------------------------------------------------------------------------------------


@st.composite
def self_attention_modules(draw: st.DrawFn, *, dropout: float = 0.0) -> MultiHeadAttention:
    config = draw(mha_configs(self_attention=True))
    backend = draw(st.sampled_from(BACKENDS), label="backend")
    module = MultiHeadAttention(config.d_model, config.num_heads, dropout=dropout, backend=backend,
                                dtype=torch.float64, **config.kwargs())
    return randomize_parameters(module, draw(seeds(), label="param_seed")).eval()


def _input(module: MultiHeadAttention, b: int, t: int, seed: int) -> Tensor:
    return randn((b, t, module.input_dim), seed)


@given(module=self_attention_modules(), b=st.integers(1, 3), t=st.integers(1, 6), seed=seeds(), data=st.data())
def test_causal_self_attention_ignores_the_future(module: MultiHeadAttention, b: int, t: int, seed: int,
                                                  data: st.DataObject) -> None:
    x = _input(module, b, t, seed)
    i = data.draw(st.integers(0, t - 1), label="position")
    x2 = x.clone()
    x2[:, i + 1 :] = 10 * randn(x2[:, i + 1 :].shape, seed + 1)
    before, _ = _ours(module, x, is_causal=True)
    after, _ = _ours(module, x2, is_causal=True)
    assert_close(after[:, : i + 1], before[:, : i + 1], EXACTISH)


@given(module=self_attention_modules(), b=st.integers(1, 2), t=st.integers(1, 6), seed=seeds())
def test_causal_self_attention_gradient(module: MultiHeadAttention, b: int, t: int, seed: int) -> None:
    """d out[i] / d x[j] is exactly zero for j > i and non-zero for j = i."""
    x = _input(module, b, t, seed).requires_grad_(True)
    out, _ = _ours(module, x, is_causal=True)
    for i in range(t):
        (grad,) = torch.autograd.grad(out[:, i].sum(), x, retain_graph=True)
        assert torch.all(grad[:, i + 1 :] == 0)
        assert torch.all(grad[:, i].abs().sum(-1) > 0)


# ----------------------------------------------------------------------------------------------------
# d. Invariances and structural properties
# ----------------------------------------------------------------------------------------------------


@given(case=mha_cases(), backend=st.sampled_from(BACKENDS), need_weights=st.booleans())
def test_batch_elements_are_independent(case: MHACase, backend: Backend, need_weights: bool) -> None:
    config = case.config
    module = MultiHeadAttention(config.d_model, config.num_heads, backend=backend, dtype=torch.float64,
                                **config.kwargs())
    randomize_parameters(module, case.seed + 1)
    out, weights = case.call(module, need_weights=need_weights, average=False)
    for i in range(case.b):
        one = slice(i, i + 1)
        attn_mask = case.attn_mask
        if attn_mask is not None and attn_mask.ndim >= 3 and attn_mask.shape[0] > 1:
            attn_mask = attn_mask[one]
        single = MHACase(
            config=config, b=1, t=case.t, s=case.s, query=case.query[one],
            key=None if case.key is None else case.key[one], value=None if case.value is None else case.value[one],
            attn_mask=attn_mask,
            key_padding_mask=None if case.key_padding_mask is None else case.key_padding_mask[one],
            is_causal=case.is_causal, torch_attn_mask=None, torch_key_padding_mask=None, seed=case.seed)
        single_out, single_weights = single.call(module, need_weights=need_weights, average=False)
        assert_close(out[one], single_out, EXACTISH)
        if need_weights:
            assert weights is not None
            assert single_weights is not None
            assert_close(weights[one], single_weights, EXACTISH)


@given(module=self_attention_modules(), b=st.integers(1, 3), t=st.integers(1, 6), seed=seeds(), data=st.data())
def test_self_attention_is_permutation_equivariant(module: MultiHeadAttention, b: int, t: int, seed: int,
                                                   data: st.DataObject) -> None:
    """Without masks or positions, permuting the sequence permutes the output, and the weights on both
    axes (the appended bias_k/zero keys stay last)."""
    x = _input(module, b, t, seed)
    perm = torch.tensor(data.draw(st.permutations(range(t)), label="perm"))
    out, weights = _ours(module, x, need_weights=True, average_attn_weights=False)
    out_p, weights_p = _ours(module, x[:, perm], need_weights=True, average_attn_weights=False)
    assert weights is not None
    assert weights_p is not None
    assert_close(out_p, out[:, perm], EXACTISH)
    key_perm = torch.cat([perm, torch.arange(t, weights.shape[-1])])
    assert_close(weights_p, weights[:, :, perm][..., key_perm], EXACTISH)


@given(config=mha_configs(), b=st.integers(1, 3), t=st.integers(1, 5), s=st.integers(1, 6),
       backend=st.sampled_from(BACKENDS), seed=seeds(), data=st.data())
def test_key_padding_equals_truncation(config: MHAConfig, b: int, t: int, s: int, backend: Backend, seed: int,
                                       data: st.DataObject) -> None:
    """Cross-attention with padded keys (filled with junk) equals attention to the real keys only."""
    module = MultiHeadAttention(config.d_model, config.num_heads, backend=backend, dtype=torch.float64,
                                **config.kwargs())
    randomize_parameters(module, seed)
    real = data.draw(key_padding_masks(b, s), label="real")
    query = randn((b, t, config.query_width), seed + 1)
    key = randn((b, s, config.key_width), seed + 2)
    value = randn((b, s, config.value_width), seed + 3)
    junk_key = torch.where(real[..., None], key, 1e3 * randn(key.shape, seed + 4))
    junk_value = torch.where(real[..., None], value, 1e3 * randn(value.shape, seed + 5))
    out, _ = _ours(module, query, junk_key, junk_value, key_padding_mask=real)
    for i in range(b):
        truncated, _ = _ours(module, query[i : i + 1], key[i : i + 1, real[i]], value[i : i + 1, real[i]])
        assert_close(out[i : i + 1], truncated, EXACTISH)


@given(config=mha_configs(extras=False), b=st.integers(1, 3), t=st.integers(1, 5), s=st.integers(1, 6),
       backend=st.sampled_from(BACKENDS), need_weights=st.booleans(), seed=seeds(), data=st.data())
def test_fully_masked_query_rows(config: MHAConfig, b: int, t: int, s: int, backend: Backend, need_weights: bool,
                                 seed: int, data: st.DataObject) -> None:
    """A query row with no allowed key outputs exactly ``out_proj.bias`` (the attention output is zero),
    its weights are zero, and every gradient is finite."""
    module = MultiHeadAttention(config.d_model, config.num_heads, backend=backend, dtype=torch.float64,
                                **config.kwargs())
    randomize_parameters(module, seed)
    keep = data.draw(keep_masks((b, t, s), fully_masked_rows=True), label="keep")
    keep[:, data.draw(st.integers(0, t - 1), label="dead_row")] = False
    query = randn((b, t, config.query_width), seed + 1).requires_grad_(True)
    key = randn((b, s, config.key_width), seed + 2).requires_grad_(True)
    value = randn((b, s, config.value_width), seed + 3).requires_grad_(True)
    out, weights = _ours(module, query, key, value, attn_mask=keep, need_weights=need_weights)
    dead = ~keep.any(-1)
    bias = module.out_proj.bias
    expected = torch.zeros(config.d_model, dtype=torch.float64) if bias is None else bias
    assert_close(out[dead], expected.expand(int(dead.sum()), -1), EXACTISH)
    if need_weights:
        assert weights is not None
        assert torch.all(weights[dead] == 0)
    grads = torch.autograd.grad(out.square().sum(), (query, key, value, *module.parameters()))
    for grad in grads:
        assert torch.all(torch.isfinite(grad))


@given(config=mha_configs(self_attention=True), backend=st.sampled_from(BACKENDS), b=st.integers(1, 3),
       t=st.integers(1, 6), seed=seeds())
def test_key_none_equals_query_as_key_and_value(config: MHAConfig, backend: Backend, b: int, t: int,
                                                seed: int) -> None:
    """``m(x)`` (fused projection) equals ``m(x, x, x)`` (the cross-attention code path)."""
    module = MultiHeadAttention(config.d_model, config.num_heads, backend=backend, dtype=torch.float64,
                                **config.kwargs())
    randomize_parameters(module, seed)
    x = randn((b, t, config.query_width), seed + 1)
    assert_close(_ours(module, x)[0], _ours(module, x, x, x)[0], EXACTISH)


@fewer_examples(3)
@given(config=mha_configs(max_heads=2, max_head_dim=2, max_width=3), b=st.integers(1, 2), t=st.integers(1, 3),
       s=st.integers(1, 3), is_causal=st.booleans(), backend=st.sampled_from(BACKENDS), seed=seeds(), data=st.data())
def test_gradcheck(config: MHAConfig, b: int, t: int, s: int, is_causal: bool, backend: Backend, seed: int,
                   data: st.DataObject) -> None:
    module = MultiHeadAttention(config.d_model, config.num_heads, backend=backend, dtype=torch.float64,
                                **config.kwargs())
    randomize_parameters(module, seed)
    keep = data.draw(st.none() | keep_masks((t, s), fully_masked_rows=True), label="keep")
    inputs = (randn((b, t, config.query_width), seed + 1).requires_grad_(True),
              randn((b, s, config.key_width), seed + 2).requires_grad_(True),
              randn((b, s, config.value_width), seed + 3).requires_grad_(True))

    def fn(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        return _ours(module, query, key, value, attn_mask=keep, is_causal=is_causal)[0]

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)


@given(case=mha_cases(), backend=st.sampled_from(BACKENDS), need_weights=st.booleans())
def test_deterministic(case: MHACase, backend: Backend, need_weights: bool) -> None:
    config = case.config
    module = MultiHeadAttention(config.d_model, config.num_heads, backend=backend, dtype=torch.float64,
                                **config.kwargs())
    randomize_parameters(module, case.seed + 1)
    first = case.call(module, need_weights=need_weights)
    second = case.call(module, need_weights=need_weights)
    assert torch.equal(first[0], second[0])
    if need_weights:
        assert first[1] is not None
        assert second[1] is not None
        assert torch.equal(first[1], second[1])


@pytest.mark.parametrize("p", [0.1, 0.5])
@given(case=mha_cases(), backend=st.sampled_from(BACKENDS), need_weights=st.booleans())
def test_dropout_is_off_in_eval_and_zero_dropout_ignores_train(p: float, case: MHACase, backend: Backend,
                                                               need_weights: bool) -> None:
    """Eval mode with dropout p equals dropout 0; with dropout 0, train mode equals eval mode."""
    config = case.config
    plain = MultiHeadAttention(config.d_model, config.num_heads, backend=backend, dtype=torch.float64,
                               **config.kwargs())
    randomize_parameters(plain, case.seed + 1)
    dropping = MultiHeadAttention(config.d_model, config.num_heads, dropout=p, backend=backend, dtype=torch.float64,
                                  **config.kwargs())
    dropping.load_state_dict(plain.state_dict())
    plain.eval()
    dropping.eval()
    want = case.call(plain, need_weights=need_weights)
    got = case.call(dropping, need_weights=need_weights)
    assert torch.equal(got[0], want[0])
    plain.train()
    trained = case.call(plain, need_weights=need_weights)
    assert torch.equal(trained[0], want[0])
    if need_weights:
        assert want[1] is not None
        assert got[1] is not None
        assert trained[1] is not None
        assert torch.equal(got[1], want[1])
        assert torch.equal(trained[1], want[1])


@given(case=mha_cases(), p=st.sampled_from([0.5, 0.1, 0.9]))
def test_dropout_in_training_zeroes_or_rescales_weights(case: MHACase, p: float) -> None:
    """In training, every returned per-head weight is 0 or the eval weight divided by 1 - p."""
    config = case.config
    module = MultiHeadAttention(config.d_model, config.num_heads, dropout=p, dtype=torch.float64, **config.kwargs())
    randomize_parameters(module, case.seed + 1)
    _, clean = case.call(module.eval(), need_weights=True, average=False)
    _, dropped = case.call(module.train(), need_weights=True, average=False)
    assert clean is not None
    assert dropped is not None
    kept = dropped != 0
    assert_close(dropped[kept], clean[kept] / (1 - p), EXACTISH)
