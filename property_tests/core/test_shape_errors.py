"""Every plausible wrong shape or dtype raises ``ShapeError`` (a ``jaxtyping.TypeCheckError``) that names
the argument and, where one is involved, the axis with its actual and expected sizes.

Each test draws a valid call and breaks exactly one thing, so the error must point at that thing.
"""

from collections.abc import Callable
from typing import Literal

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from jaxtyping import TypeCheckError
from torch import Tensor

from typed_transformer import MultiHeadAttention, ShapeError, scaled_dot_product_attention
from typed_transformer.strategies import (
    AttentionShape,
    MHAConfig,
    attention_shapes,
    mha_configs,
    randn,
    seeds,
)

Backend = Literal["reference", "sdpa"]
BACKENDS: tuple[Backend, ...] = ("reference", "sdpa")
CORE = "typed_transformer.attention.scaled_dot_product_attention"
FORWARD = "typed_transformer.multihead.MultiHeadAttention.forward"


def other_than(size: int, *, low: int = 1, high: int = 9) -> st.SearchStrategy[int]:
    """A size in ``low..high`` different from ``size``."""
    return st.integers(low, high).filter(lambda n: n != size)


def assert_shape_error(call: Callable[[], object], function: str, argument: str, axis: str | None = None, *,
                       actual: int | None = None, expected: int | None = None) -> ShapeError:
    """``call()`` raises exactly ShapeError (also a TypeCheckError) about ``argument``/``axis``."""
    with pytest.raises(ShapeError) as info:
        call()
    err = info.value
    assert isinstance(err, TypeCheckError)
    assert err.function == function
    assert err.argument == argument
    assert err.axis == axis
    if actual is not None:
        assert err.actual == actual
    if expected is not None:
        assert err.expected == expected
    head = str(err).splitlines()[0]
    assert head.startswith(f"{function}(): {argument}: ")
    if axis is not None:
        assert f"axis {axis} is {err.actual}" in head
    return err


def qkv(shape: AttentionShape, seed: int, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor, Tensor]:
    return randn(shape.q, seed, dtype=dtype), randn(shape.k, seed + 1, dtype=dtype), randn(shape.v, seed + 2,
                                                                                             dtype=dtype)


def core(q: Tensor, k: Tensor, v: Tensor, backend: Backend, **kwargs: object) -> Callable[[], object]:
    return lambda: scaled_dot_product_attention(q, k, v, backend=backend, **kwargs)  # type: ignore[call-overload]


# ----------------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# ----------------------------------------------------------------------------------------------------


@given(shape=attention_shapes(), seed=seeds(), backend=st.sampled_from(BACKENDS), data=st.data())
def test_core_key_head_size_mismatch(shape: AttentionShape, seed: int, backend: Backend, data: st.DataObject) -> None:
    q, k, v = qkv(shape, seed)
    d = data.draw(other_than(shape.d), label="wrong_d")
    k = randn((shape.b, shape.g, shape.s, d), seed)
    assert_shape_error(core(q, k, v, backend), CORE, "k", "d", actual=d, expected=shape.d)


@given(shape=attention_shapes(), seed=seeds(), backend=st.sampled_from(BACKENDS), data=st.data())
def test_core_value_length_mismatch(shape: AttentionShape, seed: int, backend: Backend, data: st.DataObject) -> None:
    """k and v disagree on the number of key positions s."""
    q, k, _ = qkv(shape, seed)
    s = data.draw(other_than(shape.s), label="wrong_s")
    v = randn((shape.b, shape.g, s, shape.dv), seed)
    assert_shape_error(core(q, k, v, backend), CORE, "v", "s", actual=s, expected=shape.s)


@given(shape=attention_shapes(), seed=seeds(), backend=st.sampled_from(BACKENDS), data=st.data())
def test_core_value_heads_mismatch(shape: AttentionShape, seed: int, backend: Backend, data: st.DataObject) -> None:
    q, k, _ = qkv(shape, seed)
    g = data.draw(other_than(shape.g), label="wrong_g")
    v = randn((shape.b, g, shape.s, shape.dv), seed)
    assert_shape_error(core(q, k, v, backend), CORE, "v", "g", actual=g, expected=shape.g)


@given(shape=attention_shapes(), seed=seeds(), backend=st.sampled_from(BACKENDS),
       which=st.sampled_from(["k", "v"]), data=st.data())
def test_core_batch_mismatch(shape: AttentionShape, seed: int, backend: Backend, which: str,
                             data: st.DataObject) -> None:
    q, k, v = qkv(shape, seed)
    b = data.draw(other_than(shape.b), label="wrong_b")
    if which == "k":
        k = randn((b, *shape.k[1:]), seed)
    else:
        v = randn((b, *shape.v[1:]), seed)
    assert_shape_error(core(q, k, v, backend), CORE, which, "b", actual=b, expected=shape.b)


@given(shape=attention_shapes(max_group=1), seed=seeds(), backend=st.sampled_from(BACKENDS), data=st.data())
def test_core_query_heads_not_a_multiple_of_kv_heads(shape: AttentionShape, seed: int, backend: Backend,
                                                     data: st.DataObject) -> None:
    g = data.draw(st.integers(2, 4), label="g")
    h = data.draw(st.integers(1, 9).filter(lambda n: n % g != 0), label="h")
    q = randn((shape.b, h, shape.t, shape.d), seed, dtype=torch.float32)
    k = randn((shape.b, g, shape.s, shape.d), seed + 1, dtype=torch.float32)
    v = randn((shape.b, g, shape.s, shape.dv), seed + 2, dtype=torch.float32)
    assert_shape_error(core(q, k, v, backend), CORE, "k", "g", actual=g)


@given(shape=attention_shapes(), seed=seeds(), backend=st.sampled_from(BACKENDS),
       which=st.sampled_from(["k", "v"]),
       dtypes=st.permutations([torch.float32, torch.float64, torch.bfloat16]).map(lambda p: p[:2]))
def test_core_mixed_dtypes(shape: AttentionShape, seed: int, backend: Backend, which: str,
                           dtypes: list[torch.dtype]) -> None:
    q, k, v = qkv(shape, seed, dtype=dtypes[0])
    if which == "k":
        k = k.to(dtypes[1])
    else:
        v = v.to(dtypes[1])
    assert_shape_error(core(q, k, v, backend), CORE, which)


@given(shape=attention_shapes(), seed=seeds(), backend=st.sampled_from(BACKENDS),
       which=st.sampled_from(["q", "k", "v"]), dtype=st.sampled_from([torch.int64, torch.int32, torch.bool]))
def test_core_non_float_inputs(shape: AttentionShape, seed: int, backend: Backend, which: str,
                               dtype: torch.dtype) -> None:
    tensors = dict(zip("qkv", qkv(shape, seed), strict=True))
    tensors[which] = tensors[which].to(dtype)
    assert_shape_error(core(tensors["q"], tensors["k"], tensors["v"], backend), CORE, which)


@given(shape=attention_shapes(), seed=seeds(), backend=st.sampled_from(BACKENDS),
       which=st.sampled_from(["q", "k", "v"]), drop_axis=st.integers(0, 3))
def test_core_wrong_rank(shape: AttentionShape, seed: int, backend: Backend, which: str, drop_axis: int) -> None:
    tensors = dict(zip("qkv", qkv(shape, seed), strict=True))
    tensors[which] = tensors[which].select(drop_axis, 0)
    assert_shape_error(core(tensors["q"], tensors["k"], tensors["v"], backend), CORE, which)


@given(shape=attention_shapes(), seed=seeds(), backend=st.sampled_from(BACKENDS), four_d=st.booleans(),
       as_float=st.booleans(), axis=st.sampled_from(["t", "s"]), data=st.data())
def test_core_mask_wrong_length(shape: AttentionShape, seed: int, backend: Backend, four_d: bool, as_float: bool,
                                axis: str, data: st.DataObject) -> None:
    q, k, v = qkv(shape, seed)
    right = shape.t if axis == "t" else shape.s
    # t may be 1 (a mask broadcast over queries, e.g. key padding), so a wrong t is at least 2.
    wrong = data.draw(other_than(right, low=2 if axis == "t" else 1), label="wrong")
    t, s = (wrong, shape.s) if axis == "t" else (shape.t, wrong)
    size = (shape.b, shape.h, t, s) if four_d else (t, s)
    mask = randn(size, seed + 3, dtype=torch.float32)
    attn_mask = mask if as_float else mask > 0
    assert_shape_error(core(q, k, v, backend, attn_mask=attn_mask), CORE, "attn_mask", axis, actual=wrong,
                       expected=right)


@given(shape=attention_shapes(), seed=seeds(), backend=st.sampled_from(BACKENDS),
       axis=st.sampled_from(["b", "h"]), data=st.data())
def test_core_mask_wrong_batch_or_heads(shape: AttentionShape, seed: int, backend: Backend, axis: str,
                                        data: st.DataObject) -> None:
    """A 4-D mask's b and h must match or be 1."""
    q, k, v = qkv(shape, seed)
    right = shape.b if axis == "b" else shape.h
    wrong = data.draw(other_than(right, low=2), label="wrong")
    size = (wrong, shape.h, shape.t, shape.s) if axis == "b" else (shape.b, wrong, shape.t, shape.s)
    assert_shape_error(core(q, k, v, backend, attn_mask=torch.ones(size, dtype=torch.bool)), CORE, "attn_mask",
                       axis, actual=wrong, expected=right)


@given(shape=attention_shapes(), seed=seeds(), backend=st.sampled_from(BACKENDS), as_float=st.booleans(),
       lead=st.sampled_from(["b", "h", "1"]))
def test_core_refuses_3d_masks(shape: AttentionShape, seed: int, backend: Backend, as_float: bool, lead: str) -> None:
    """A 3-D mask is ambiguous ((b, t, s)? (h, t, s)? torch's ((b h), t, s)?) and refused."""
    q, k, v = qkv(shape, seed)
    first = {"b": shape.b, "h": shape.h, "1": 1}[lead]
    mask = randn((first, shape.t, shape.s), seed + 3, dtype=torch.float32)
    attn_mask = mask if as_float else mask > 0
    assert_shape_error(core(q, k, v, backend, attn_mask=attn_mask), CORE, "attn_mask")


@given(shape=attention_shapes(), seed=seeds(), backend=st.sampled_from(BACKENDS),
       dtype=st.sampled_from([torch.int64, torch.int32, torch.uint8]), four_d=st.booleans())
def test_core_refuses_integer_masks(shape: AttentionShape, seed: int, backend: Backend, dtype: torch.dtype,
                                    four_d: bool) -> None:
    q, k, v = qkv(shape, seed)
    size = (shape.b, shape.h, shape.t, shape.s) if four_d else (shape.t, shape.s)
    assert_shape_error(core(q, k, v, backend, attn_mask=torch.ones(size, dtype=dtype)), CORE, "attn_mask")


# ----------------------------------------------------------------------------------------------------
# MultiHeadAttention.forward
# ----------------------------------------------------------------------------------------------------


@st.composite
def cross_modules(draw: st.DrawFn) -> tuple[MultiHeadAttention, MHAConfig]:
    config = draw(mha_configs())
    backend = draw(st.sampled_from(BACKENDS), label="backend")
    return MultiHeadAttention(config.d_model, config.num_heads, backend=backend, **config.kwargs()), config


def mha(module: MultiHeadAttention, *args: Tensor | None, **kwargs: object) -> Callable[[], object]:
    return lambda: module(*args, **kwargs)  # type: ignore[call-overload]  # arguments drawn at run time


sizes = st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(1, 6))


@given(module_config=cross_modules(), bts=sizes, seed=seeds(), data=st.data())
def test_mha_query_width_mismatch(module_config: tuple[MultiHeadAttention, MHAConfig], bts: tuple[int, int, int],
                                  seed: int, data: st.DataObject) -> None:
    module, config = module_config
    b, t, s = bts
    width = data.draw(other_than(config.query_width, high=12), label="width")
    query = randn((b, t, width), seed, dtype=torch.float32)
    key = randn((b, s, config.key_width), seed + 1, dtype=torch.float32)
    value = randn((b, s, config.value_width), seed + 2, dtype=torch.float32)
    assert_shape_error(mha(module, query, key, value), FORWARD, "query", "input_dim", actual=width,
                       expected=config.query_width)
    if config.key_width == config.value_width == config.query_width:  # also through self-attention
        assert_shape_error(mha(module, query), FORWARD, "query", "input_dim", actual=width,
                           expected=config.query_width)


@given(module_config=cross_modules(), bts=sizes, seed=seeds(), which=st.sampled_from(["key", "value"]),
       data=st.data())
def test_mha_key_or_value_width_mismatch(module_config: tuple[MultiHeadAttention, MHAConfig],
                                         bts: tuple[int, int, int], seed: int, which: str,
                                         data: st.DataObject) -> None:
    module, config = module_config
    b, t, s = bts
    right = config.key_width if which == "key" else config.value_width
    width = data.draw(other_than(right, high=12), label="width")
    query = randn((b, t, config.query_width), seed, dtype=torch.float32)
    key = randn((b, s, width if which == "key" else config.key_width), seed + 1, dtype=torch.float32)
    value = randn((b, s, width if which == "value" else config.value_width), seed + 2, dtype=torch.float32)
    axis = "kdim" if which == "key" else "vdim"
    assert_shape_error(mha(module, query, key, value), FORWARD, which, axis, actual=width, expected=right)


@given(module_config=cross_modules(), bts=sizes, seed=seeds(), which=st.sampled_from(["key", "value"]),
       data=st.data())
def test_mha_batch_mismatch(module_config: tuple[MultiHeadAttention, MHAConfig], bts: tuple[int, int, int],
                            seed: int, which: str, data: st.DataObject) -> None:
    module, config = module_config
    b, t, s = bts
    wrong = data.draw(other_than(b), label="wrong_b")
    query = randn((b, t, config.query_width), seed, dtype=torch.float32)
    key = randn((wrong if which == "key" else b, s, config.key_width), seed + 1, dtype=torch.float32)
    value = randn((wrong if which == "value" else b, s, config.value_width), seed + 2, dtype=torch.float32)
    assert_shape_error(mha(module, query, key, value), FORWARD, which, "b", actual=wrong, expected=b)


@given(module_config=cross_modules(), bts=sizes, seed=seeds(), data=st.data())
def test_mha_key_value_length_mismatch(module_config: tuple[MultiHeadAttention, MHAConfig],
                                       bts: tuple[int, int, int], seed: int, data: st.DataObject) -> None:
    module, config = module_config
    b, t, s = bts
    wrong = data.draw(other_than(s), label="wrong_s")
    query = randn((b, t, config.query_width), seed, dtype=torch.float32)
    key = randn((b, s, config.key_width), seed + 1, dtype=torch.float32)
    value = randn((b, wrong, config.value_width), seed + 2, dtype=torch.float32)
    assert_shape_error(mha(module, query, key, value), FORWARD, "value", "s", actual=wrong, expected=s)


@given(module_config=cross_modules(), bts=sizes, seed=seeds(), which=st.sampled_from(["key", "value"]),
       dtypes=st.permutations([torch.float32, torch.float64, torch.bfloat16]).map(lambda p: p[:2]))
def test_mha_mixed_dtypes(module_config: tuple[MultiHeadAttention, MHAConfig], bts: tuple[int, int, int],
                          seed: int, which: str, dtypes: list[torch.dtype]) -> None:
    """query in the module's dtype, key or value in another: a dtype error naming the odd one out."""
    module, config = module_config
    module.to(dtypes[0])
    b, t, s = bts
    query = randn((b, t, config.query_width), seed, dtype=dtypes[0])
    key = randn((b, s, config.key_width), seed + 1, dtype=dtypes[1] if which == "key" else dtypes[0])
    value = randn((b, s, config.value_width), seed + 2, dtype=dtypes[1] if which == "value" else dtypes[0])
    assert_shape_error(mha(module, query, key, value), FORWARD, which)


@given(module_config=cross_modules(), bts=sizes, seed=seeds())
def test_mha_self_attention_on_a_module_with_other_key_widths(module_config: tuple[MultiHeadAttention, MHAConfig],
                                                               bts: tuple[int, int, int], seed: int) -> None:
    """``m(query)`` (key=None) on a module whose kdim/vdim differ from the query width: the query cannot
    serve as key/value; that is a shape error about the key (it defaults to the query), not a matmul error."""
    module, config = module_config
    if config.key_width == config.query_width and config.value_width == config.query_width:
        return
    b, t, _ = bts
    query = randn((b, t, config.query_width), seed, dtype=torch.float32)
    with pytest.raises(ShapeError) as info:
        module(query)
    assert info.value.argument in ("key", "value", "query")
    assert info.value.axis in ("kdim", "vdim", "input_dim")


@given(module_config=cross_modules(), bts=sizes, seed=seeds(),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.int64, torch.uint8]))
def test_mha_key_padding_mask_must_be_bool(module_config: tuple[MultiHeadAttention, MHAConfig],
                                           bts: tuple[int, int, int], seed: int, dtype: torch.dtype) -> None:
    module, config = module_config
    b, t, s = bts
    query = randn((b, t, config.query_width), seed, dtype=torch.float32)
    key = randn((b, s, config.key_width), seed + 1, dtype=torch.float32)
    value = randn((b, s, config.value_width), seed + 2, dtype=torch.float32)
    padding = torch.ones(b, s, dtype=dtype)
    assert_shape_error(mha(module, query, key, value, key_padding_mask=padding), FORWARD, "key_padding_mask")


@given(module_config=cross_modules(), bts=sizes, seed=seeds(), data=st.data())
def test_mha_key_padding_mask_wrong_length(module_config: tuple[MultiHeadAttention, MHAConfig],
                                           bts: tuple[int, int, int], seed: int, data: st.DataObject) -> None:
    module, config = module_config
    b, t, s = bts
    query = randn((b, t, config.query_width), seed, dtype=torch.float32)
    key = randn((b, s, config.key_width), seed + 1, dtype=torch.float32)
    value = randn((b, s, config.value_width), seed + 2, dtype=torch.float32)
    wrong = data.draw(other_than(s), label="wrong_s")
    padding = torch.ones(b, wrong, dtype=torch.bool)
    assert_shape_error(mha(module, query, key, value, key_padding_mask=padding), FORWARD, "key_padding_mask", "s",
                       actual=wrong, expected=s)


@given(config=mha_configs(self_attention=True), bts=sizes, seed=seeds(), data=st.data())
def test_mha_self_attention_key_padding_mask_wrong_length(config: MHAConfig, bts: tuple[int, int, int], seed: int,
                                                          data: st.DataObject) -> None:
    """With key=None the keys are the query positions: a padding mask of any other length is refused."""
    module = MultiHeadAttention(config.d_model, config.num_heads, **config.kwargs())
    b, t, _ = bts
    query = randn((b, t, config.query_width), seed, dtype=torch.float32)
    wrong = data.draw(other_than(t), label="wrong_s")
    padding = torch.ones(b, wrong, dtype=torch.bool)
    assert_shape_error(mha(module, query, key_padding_mask=padding), FORWARD, "key_padding_mask", "s", actual=wrong,
                       expected=t)


@given(module_config=cross_modules(), bts=sizes, seed=seeds(), data=st.data())
def test_mha_key_padding_mask_wrong_batch(module_config: tuple[MultiHeadAttention, MHAConfig],
                                          bts: tuple[int, int, int], seed: int, data: st.DataObject) -> None:
    module, config = module_config
    b, t, s = bts
    query = randn((b, t, config.query_width), seed, dtype=torch.float32)
    key = randn((b, s, config.key_width), seed + 1, dtype=torch.float32)
    value = randn((b, s, config.value_width), seed + 2, dtype=torch.float32)
    wrong = data.draw(other_than(b), label="wrong_b")
    padding = torch.ones(wrong, s, dtype=torch.bool)
    assert_shape_error(mha(module, query, key, value, key_padding_mask=padding), FORWARD, "key_padding_mask", "b",
                       actual=wrong, expected=b)


@given(module_config=cross_modules(), bts=sizes, seed=seeds(), self_attention=st.booleans(),
       layout=st.sampled_from(["t s", "b t s", "b h t s"]), axis=st.sampled_from(["t", "s"]),
       as_float=st.booleans(), data=st.data())
def test_mha_attn_mask_wrong_length(module_config: tuple[MultiHeadAttention, MHAConfig], bts: tuple[int, int, int],
                                    seed: int, self_attention: bool, layout: str, axis: str, as_float: bool,
                                    data: st.DataObject) -> None:
    module, config = module_config
    self_attention = self_attention and config.key_width == config.query_width == config.value_width
    b, t, s = bts
    s = t if self_attention else s
    query = randn((b, t, config.query_width), seed, dtype=torch.float32)
    key = None if self_attention else randn((b, s, config.key_width), seed + 1, dtype=torch.float32)
    value = None if self_attention else randn((b, s, config.value_width), seed + 2, dtype=torch.float32)
    right = t if axis == "t" else s
    broadcastable = axis == "t" and len(layout.split()) == 4  # '#b #h #t s': a t of 1 is a valid broadcast
    wrong = data.draw(other_than(right, low=2 if broadcastable else 1), label="wrong")
    sizes = {"b": b, "h": config.num_heads, "t": wrong if axis == "t" else t, "s": wrong if axis == "s" else s}
    mask = randn(tuple(sizes[a] for a in layout.split()), seed + 3, dtype=torch.float32)
    attn_mask = mask if as_float else mask > 0
    assert_shape_error(mha(module, query, key, value, attn_mask=attn_mask), FORWARD, "attn_mask", axis,
                       actual=wrong, expected=right)


@given(module_config=cross_modules(), bts=sizes, seed=seeds(), axis=st.sampled_from(["b", "num_heads"]),
       data=st.data())
def test_mha_attn_mask_wrong_batch_or_heads(module_config: tuple[MultiHeadAttention, MHAConfig],
                                            bts: tuple[int, int, int], seed: int, axis: str,
                                            data: st.DataObject) -> None:
    module, config = module_config
    b, t, s = bts
    query = randn((b, t, config.query_width), seed, dtype=torch.float32)
    key = randn((b, s, config.key_width), seed + 1, dtype=torch.float32)
    value = randn((b, s, config.value_width), seed + 2, dtype=torch.float32)
    right = b if axis == "b" else config.num_heads
    wrong = data.draw(other_than(right, low=2), label="wrong")
    size = (wrong, config.num_heads, t, s) if axis == "b" else (b, wrong, t, s)
    assert_shape_error(mha(module, query, key, value, attn_mask=torch.ones(size, dtype=torch.bool)), FORWARD,
                       "attn_mask", axis, actual=wrong, expected=right)


@given(module_config=cross_modules(), bts=sizes, seed=seeds(), data=st.data())
def test_mha_3d_attn_mask_wrong_batch(module_config: tuple[MultiHeadAttention, MHAConfig], bts: tuple[int, int, int],
                                      seed: int, data: st.DataObject) -> None:
    """A 3-D mask is ours ``(b, t, s)``; torch's ``((b h), t, s)`` must go through attn_mask_from_torch."""
    module, config = module_config
    b, t, s = bts
    query = randn((b, t, config.query_width), seed, dtype=torch.float32)
    key = randn((b, s, config.key_width), seed + 1, dtype=torch.float32)
    value = randn((b, s, config.value_width), seed + 2, dtype=torch.float32)
    wrong = data.draw(other_than(b), label="wrong_b")
    mask = torch.ones(wrong, t, s, dtype=torch.bool)
    assert_shape_error(mha(module, query, key, value, attn_mask=mask), FORWARD, "attn_mask", "b", actual=wrong,
                       expected=b)


@given(module_config=cross_modules(), bts=sizes, dtype=st.sampled_from([torch.int64, torch.int32, torch.uint8]),
       layout=st.sampled_from(["t s", "b t s", "b h t s"]), seed=seeds())
def test_mha_refuses_integer_attn_masks(module_config: tuple[MultiHeadAttention, MHAConfig],
                                        bts: tuple[int, int, int], dtype: torch.dtype, layout: str,
                                        seed: int) -> None:
    module, config = module_config
    b, t, s = bts
    query = randn((b, t, config.query_width), seed, dtype=torch.float32)
    key = randn((b, s, config.key_width), seed + 1, dtype=torch.float32)
    value = randn((b, s, config.value_width), seed + 2, dtype=torch.float32)
    sizes = {"b": b, "h": config.num_heads, "t": t, "s": s}
    mask = torch.ones(tuple(sizes[a] for a in layout.split()), dtype=dtype)
    assert_shape_error(mha(module, query, key, value, attn_mask=mask), FORWARD, "attn_mask")


@given(module_config=cross_modules(), bts=sizes, seed=seeds(), drop_axis=st.integers(0, 2))
def test_mha_wrong_rank(module_config: tuple[MultiHeadAttention, MHAConfig], bts: tuple[int, int, int], seed: int,
                        drop_axis: int) -> None:
    """Unbatched (2-D) input is refused: the module is batch-first only."""
    module, config = module_config
    b, t, s = bts
    query = randn((b, t, config.query_width), seed, dtype=torch.float32).select(drop_axis, 0)
    key = randn((b, s, config.key_width), seed + 1, dtype=torch.float32)
    value = randn((b, s, config.value_width), seed + 2, dtype=torch.float32)
    assert_shape_error(mha(module, query, key, value), FORWARD, "query")
