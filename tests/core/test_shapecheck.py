"""The shape-checking mechanism: error texts, the switch, wrappers, torch.compile, the trace."""

import inspect
import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jaxtyping
import pytest
import torch
from jaxtyping import Float
from torch import Tensor, nn

import typed_transformer as tt
from tests.support import future_annotations_module as future_module
from tests.support.foreign_wrappers import logged, trampoline
from typed_transformer import MultiHeadAttention, ShapeError, scaled_dot_product_attention
from typed_transformer.shapecheck import shape_checked, typechecked

SDPA = "typed_transformer.attention.scaled_dot_product_attention"
MHA = "typed_transformer.multihead.MultiHeadAttention.forward"


def qkv(b: int = 2, h: int = 4, t: int = 16, d: int = 8) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(b, h, t, d, generator=g) for _ in range(3))  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------------
# Error messages
# ---------------------------------------------------------------------------------------------------


def test_wrong_head_size_names_function_argument_axis_and_sizes() -> None:
    q, _, v = qkv()
    with pytest.raises(ShapeError) as info:
        scaled_dot_product_attention(q, torch.randn(2, 4, 16, 7), v)
    err = info.value
    assert isinstance(err, jaxtyping.TypeCheckError)
    assert str(err).splitlines()[0] == f"{SDPA}(): k: axis d is 7, expected 8 (bound by q)"
    assert (err.function, err.argument, err.axis, err.actual, err.expected, err.bound_by) == (
        SDPA, "k", "d", 7, 8, "q")


def test_key_length_mismatch_between_k_and_v() -> None:
    q, k, _ = qkv()
    with pytest.raises(ShapeError) as info:
        scaled_dot_product_attention(q, k, torch.randn(2, 4, 17, 8))
    assert info.value.summary == f"{SDPA}(): v: axis s is 17, expected 16 (bound by k)"


def test_message_lists_every_tensor_argument() -> None:
    q, _, v = qkv()
    with pytest.raises(ShapeError) as info:
        scaled_dot_product_attention(q, torch.randn(2, 4, 16, 7), v)
    lines = str(info.value).splitlines()
    assert lines[1:] == ["  q: f32[2,4,16,8]  as 'b h t d'", "  k: f32[2,4,16,7]  as 'b g s d'",
                         "  v: f32[2,4,16,8]  as 'b g s dv'"]


def test_float_key_padding_mask_where_bool_is_required() -> None:
    m = MultiHeadAttention(8, 2)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ShapeError) as info:
        m(x, key_padding_mask=torch.ones(2, 5))
    assert info.value.summary == f"{MHA}(): key_padding_mask: dtype is float32, expected bool"


def test_int_mask_lists_what_is_accepted() -> None:
    q, k, v = qkv()
    with pytest.raises(ShapeError) as info:
        scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(16, 16, dtype=torch.int64))
    assert info.value.argument == "attn_mask"
    assert info.value.reason == ("is i64[16,16], expected '#b #h #t s' or 't s' of bool or a floating-point dtype")


def test_wrong_model_width_is_reported_by_the_check_not_by_a_matmul() -> None:
    m = MultiHeadAttention(512, 8, input_dim=1024)
    with pytest.raises(ShapeError) as info:
        m(torch.randn(30, 5, 1000))
    assert info.value.summary == f"{MHA}(): query: axis input_dim is 1000, expected 1024 (self.input_dim)"
    assert (info.value.axis, info.value.actual, info.value.expected) == ("input_dim", 1000, 1024)


def test_wrong_rank() -> None:
    q, _, v = qkv()
    with pytest.raises(ShapeError) as info:
        scaled_dot_product_attention(q, torch.randn(2, 16, 8), v)
    assert info.value.reason == "has 3 axes (2, 16, 8), expected 4 'b g s d'"


def test_non_tensor_argument() -> None:
    q, k, v = qkv()
    with pytest.raises(jaxtyping.TypeCheckError) as info:
        scaled_dot_product_attention(q, k, v, is_causal="yes")  # type: ignore[call-overload]
    assert isinstance(info.value, ShapeError)
    assert info.value.argument == "is_causal"
    assert info.value.reason == "expected bool, got str 'yes'"


def test_check_runs_before_the_body() -> None:
    calls = []

    def body(x: Float[Tensor, "b d"], y: Float[Tensor, "b d"]) -> Float[Tensor, "b d"]:
        calls.append(1)
        return x + y

    checked = typechecked(body)
    with pytest.raises(ShapeError):
        checked(torch.ones(2, 3), torch.ones(2, 4))
    assert calls == []
    torch.testing.assert_close(checked(torch.ones(2, 3), torch.ones(2, 3)), torch.full((2, 3), 2.0))
    assert calls == [1]


def test_bad_return_value_is_reported() -> None:
    def bad(x: Float[Tensor, "b d"]) -> Float[Tensor, "d b"]:
        return x

    with pytest.raises(ShapeError) as info:
        typechecked(bad)(torch.ones(2, 3))
    assert info.value.argument == "return value"
    assert info.value.reason == "axis d is 2, expected 3 (bound by x)"


def test_bad_element_of_a_returned_tuple_is_reported() -> None:
    def pair(x: Float[Tensor, "b d"]) -> tuple[Float[Tensor, "b d"], Float[Tensor, " b"]]:
        return x, x[:, 0].repeat(2)

    with pytest.raises(ShapeError) as info:
        typechecked(pair)(torch.ones(2, 3))
    assert info.value.reason == "element 1: axis b is 4, expected 2 (bound by x)"
    assert (info.value.axis, info.value.actual, info.value.expected) == ("b", 4, 2)


def test_return_axes_are_bound_by_the_parameters_not_by_nested_calls() -> None:
    inner = typechecked(_add)

    def outer(x: Float[Tensor, "b d"]) -> Float[Tensor, "b d"]:
        return inner(torch.ones(5, 7), torch.ones(5, 7))[:2, :3] + x  # nested call binds b=5, d=7 in its scope

    torch.testing.assert_close(typechecked(outer)(torch.ones(2, 3)), torch.full((2, 3), 3.0))


# ---------------------------------------------------------------------------------------------------
# The switch
# ---------------------------------------------------------------------------------------------------


def test_runtime_switch_turns_checks_off_and_back_on() -> None:
    def f(x: Float[Tensor, "b d"], y: Float[Tensor, "b e"]) -> Float[Tensor, "b d"]:
        return x

    checked = typechecked(f)
    bad = (torch.ones(2, 3), torch.ones(4, 3))
    assert tt.checks_enabled()
    with tt.shape_checks(False):
        assert not tt.checks_enabled()
        assert checked(*bad).shape == (2, 3)
    assert tt.checks_enabled()
    with pytest.raises(ShapeError):
        checked(*bad)
    previous = tt.set_shape_checks(False)
    try:
        assert previous is True
        assert checked(*bad).shape == (2, 3)
    finally:
        tt.set_shape_checks(True)


def test_environment_variable_starts_with_checks_off() -> None:
    code = (
        "import torch, typed_transformer as tt\n"
        "print(tt.checks_enabled())\n"
        "q = torch.randn(1, 1, 2, 4)\n"
        "try:\n"
        "    tt.scaled_dot_product_attention(q, torch.randn(1, 1, 2, 3), q)\n"
        "except tt.TypeCheckError:\n"
        "    print('checked')\n"
        "except RuntimeError:\n"
        "    print('unchecked')\n"
    )
    env = {**os.environ, "JAXTYPING_DISABLE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "unchecked"]


# ---------------------------------------------------------------------------------------------------
# Wrappers (mutation testing, third-party decorators)
# ---------------------------------------------------------------------------------------------------


def _add(x: Float[Tensor, "b d"], y: Float[Tensor, "b d"]) -> Float[Tensor, "b d"]:
    return x + y


@pytest.mark.parametrize("wrap", [logged, trampoline])
def test_checks_survive_a_foreign_functools_wraps_wrapper(wrap: object) -> None:
    checked = typechecked(wrap(_add))  # type: ignore[operator]
    with pytest.raises(ShapeError) as info:
        checked(torch.ones(2, 3), torch.ones(2, 4))
    assert (info.value.argument, info.value.axis) == ("y", "d")


@pytest.mark.parametrize("fn", [future_module.add_wrapped, future_module.add_trampolined])
def test_string_annotations_under_a_foreign_wrapper_are_still_checked(fn: object) -> None:
    # jaxtyping alone resolves the strings against the wrapper's globals and silently checks nothing.
    with pytest.raises(ShapeError) as info:
        fn(torch.ones(2, 3), torch.ones(2, 4))  # type: ignore[operator]
    assert (info.value.argument, info.value.axis) == ("y", "d")


def test_class_decorator_checks_a_trampolined_forward() -> None:
    @shape_checked
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.width = 3

        @trampoline
        def forward(self, x: Float[Tensor, "b {self.width}"]) -> Float[Tensor, "b {self.width}"]:
            return 2 * x

    m = Scale()
    torch.testing.assert_close(m(torch.ones(2, 3)), torch.full((2, 3), 2.0))
    with pytest.raises(ShapeError) as info:
        m(torch.ones(2, 4))
    assert info.value.reason == "axis width is 4, expected 3 (self.width)"


def test_every_public_function_and_forward_is_checked() -> None:
    for name in tt.__all__:
        obj = getattr(tt, name)
        if inspect.isfunction(obj) and any("Tensor" in repr(a) for a in obj.__annotations__.values()):
            assert tt.is_checked(obj), name
        if inspect.isclass(obj) and issubclass(obj, nn.Module):
            assert tt.is_checked(obj.forward), name


# ---------------------------------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_module_runs_and_matches_eager(backend: str) -> None:
    torch.manual_seed(0)
    m = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 5, 16)
    mask = torch.rand(2, 5, 5) > 0.3
    torch._dynamo.reset()
    compiled = torch.compile(m, backend=backend, fullgraph=True)
    with torch.no_grad():
        expected, _ = m(x, attn_mask=mask, is_causal=True)
        got, _ = compiled(x, attn_mask=mask, is_causal=True)
    torch.testing.assert_close(got, expected)
    # The eager module is still checked after compiling.
    with pytest.raises(ShapeError):
        m(torch.randn(2, 5, 15))


def test_compiled_function_runs_and_matches_eager() -> None:
    q, k, v = qkv(b=1, h=2, t=4, d=8)
    torch._dynamo.reset()
    compiled = torch.compile(scaled_dot_product_attention, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, is_causal=True), scaled_dot_product_attention(q, k, v, is_causal=True))


# ---------------------------------------------------------------------------------------------------
# Shape trace
# ---------------------------------------------------------------------------------------------------


def test_shape_trace_prints_nested_calls_with_bound_sizes() -> None:
    m = MultiHeadAttention(512, 8, input_dim=1024)  # seed 001's module
    stream = io.StringIO()
    with tt.shape_trace(stream):
        m(torch.randn(30, 5, 1024))
    assert stream.getvalue().splitlines() == [
        "MultiHeadAttention.forward(query=f32[30,5,1024])  b=30 t=5 input_dim=1024",
        "  scaled_dot_product_attention(q=f32[30,8,5,64], k=f32[30,8,5,64], v=f32[30,8,5,64])"
        "  b=30 h=8 t=5 d=64 g=8 s=5 dv=64",
        "  -> f32[30,8,5,64]",
        "-> (f32[30,5,512], None)",
    ]


def test_shape_trace_switches_checks_on_for_its_block() -> None:
    q, _, v = qkv()
    with tt.shape_checks(False):
        with tt.shape_trace(io.StringIO()), pytest.raises(ShapeError):
            scaled_dot_product_attention(q, torch.randn(2, 4, 16, 7), v)
        assert not tt.checks_enabled()


# ---------------------------------------------------------------------------------------------------
# One switch (jaxtyping's), two modes (default and strict)
# ---------------------------------------------------------------------------------------------------


def _run(code: str, **env: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True)
    return out.stdout.splitlines()


def test_the_switch_is_jaxtypings_own() -> None:
    def disabled() -> bool:
        return bool(jaxtyping.config.jaxtyping_disable)

    with tt.shape_checks(False):
        assert disabled()
    assert not disabled()
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        assert not tt.checks_enabled()
        q, _, v = qkv()
        with pytest.raises(RuntimeError):  # unchecked: torch's own error from inside the computation
            scaled_dot_product_attention(q, torch.randn(2, 4, 16, 7), v)
    finally:
        jaxtyping.config.update("jaxtyping_disable", False)


def test_set_shape_checks_overrides_the_environment_variable() -> None:
    # Reported: with JAXTYPING_DISABLE=1, set_shape_checks(True) said "on" while jaxtyping stayed off and the
    # call failed inside einsum with a RuntimeError.
    code = (
        "import torch, typed_transformer as tt\n"
        "tt.set_shape_checks(True)\n"
        "try:\n"
        "    tt.scaled_dot_product_attention(torch.randn(1,1,2,4), torch.randn(1,1,2,3), torch.randn(1,1,2,4))\n"
        "except tt.ShapeError as err:\n"
        "    print(err.summary)\n"
    )
    assert _run(code, JAXTYPING_DISABLE="1") == [f"{SDPA}(): k: axis d is 3, expected 4 (bound by q)"]


def test_shape_trace_works_when_the_environment_switched_checks_off() -> None:
    # Reported: with JAXTYPING_DISABLE=1, shape_trace crashed a correct call with jaxtyping's AnnotationError.
    code = (
        "import torch, typed_transformer as tt\n"
        "q = torch.randn(1, 1, 2, 4)\n"
        "with tt.shape_trace():\n"
        "    tt.scaled_dot_product_attention(q, q, q)\n"
        "print(tt.checks_enabled())\n"
    )
    assert _run(code, JAXTYPING_DISABLE="1", TYPED_TRANSFORMER_STRICT="0") == [
        "scaled_dot_product_attention(q=f32[1,1,2,4], k=f32[1,1,2,4], v=f32[1,1,2,4])  b=1 h=1 t=2 d=4 g=1 s=2 dv=4",
        "-> f32[1,1,2,4]",
        "False",
    ]


def test_strict_mode_from_the_environment() -> None:
    code = "import typed_transformer as tt; print(tt.strict_checks_enabled())"
    assert _run(code, TYPED_TRANSFORMER_STRICT="1") == ["True"]
    assert _run(code, TYPED_TRANSFORMER_STRICT="0") == ["False"]


def _inner(x: Float[Tensor, "b d"], y: Float[Tensor, "b d"]) -> Float[Tensor, "b d"]:
    return x


inner = typechecked(_inner)


def _outer(x: Float[Tensor, "b d"]) -> Float[Tensor, "b d"]:
    return inner(x, x[:, :1])  # an internal shape bug: y has one column


outer = typechecked(_outer)


def test_default_mode_checks_the_outer_call_and_not_the_library_calling_itself() -> None:
    x = torch.ones(2, 3)
    with tt.strict_checks(False):
        assert not tt.strict_checks_enabled()
        assert outer(x) is x  # the nested call is not re-checked
        with pytest.raises(ShapeError) as info:
            outer(torch.ones(2, 3, 1))  # the call the user makes is
        assert (info.value.function, info.value.argument) == (f"{__name__}._outer", "x")
        with pytest.raises(ShapeError) as info:
            inner(x, x[:, :1])  # and any checked function called directly is the outer call
        assert (info.value.argument, info.value.axis) == ("y", "d")


def test_strict_mode_checks_every_nested_call() -> None:
    with tt.strict_checks(), pytest.raises(ShapeError) as info:
        outer(torch.ones(2, 3))
    assert info.value.summary == f"{__name__}._inner(): y: axis d is 1, expected 3 (bound by x)"


def test_a_users_module_calling_ours_is_checked_in_default_mode() -> None:
    class Mine(nn.Module):  # user code, not checked itself
        def __init__(self) -> None:
            super().__init__()
            self.attention = MultiHeadAttention(16, 4)

        def forward(self, x: Tensor) -> Tensor:
            out: Tensor = self.attention(x)[0]
            return out

    with tt.strict_checks(False), pytest.raises(ShapeError) as info:
        Mine()(torch.randn(2, 5, 12))
    assert info.value.summary == f"{MHA}(): query: axis input_dim is 12, expected 16 (self.input_dim)"


def test_shape_trace_shows_nested_calls_in_default_mode_too() -> None:
    m = MultiHeadAttention(8, 2)
    stream = io.StringIO()
    with tt.strict_checks(False), tt.shape_trace(stream):
        m(torch.randn(1, 3, 8))
    assert stream.getvalue().splitlines() == [
        "MultiHeadAttention.forward(query=f32[1,3,8])  b=1 t=3 input_dim=8",
        "  scaled_dot_product_attention(q=f32[1,2,3,4], k=f32[1,2,3,4], v=f32[1,2,3,4])  b=1 h=2 t=3 d=4 g=2 s=3 dv=4",
        "  -> f32[1,2,3,4]",
        "-> (f32[1,3,8], None)",
    ]


def test_unexplained_rejections_carry_jaxtypings_own_words() -> None:
    def batched(x: Float[Tensor, "*batch d"], y: Float[Tensor, "*batch d"]) -> None:
        return None

    with pytest.raises(ShapeError) as info:
        typechecked(batched)(torch.ones(2, 3), torch.ones(2, 4))
    err = info.value
    assert (err.argument, err.axis, err.actual, err.expected) == ("y", None, None, None)
    assert err.reason == "the size of dimension d is 4 which does not equal the existing value of 3"  # jaxtyping's


def test_the_library_imports_no_private_jaxtyping_module() -> None:
    src = Path(tt.__file__).parent
    offenders = [str(path) for path in src.rglob("*.py") if re.search(r"jaxtyping\._|from jaxtyping import _",
                                                                       path.read_text())]
    assert offenders == []


def test_deprecated_return_weights_warns_and_matches_the_new_function() -> None:
    q, k, v = qkv(b=1, h=2, t=3, d=4)
    with pytest.warns(DeprecationWarning, match="use scaled_dot_product_attention_with_weights") as record:
        old = scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    # Attributed to the caller, through the checks' wrappers (under mutation testing, mutmut's trampoline is a
    # third-party caller between this test and the library).
    assert record[0].filename == __file__ or f"{os.sep}mutmut{os.sep}" in record[0].filename
    new = tt.scaled_dot_product_attention_with_weights(q, k, v, is_causal=True)
    assert isinstance(old, tuple)
    torch.testing.assert_close(old, new)


# ---------------------------------------------------------------------------------------------------
# dtype and device agreement (what annotations cannot say)
# ---------------------------------------------------------------------------------------------------


def test_input_of_another_dtype_than_the_modules_parameters() -> None:
    # Reported: a float64 query passed the check and failed inside F.linear ("mat1 and mat2 must have the same
    # dtype"). Now the check names the argument, in both modes.
    m = MultiHeadAttention(8, 2)
    for strict in (False, True):
        with tt.strict_checks(strict), pytest.raises(ShapeError) as info:
            m(torch.randn(2, 3, 8, dtype=torch.float64))
        assert info.value.summary == (f"{MHA}(): query: dtype is float64, expected float32 "
                                      "(the dtype of the module's parameters)")


@pytest.mark.parametrize(("module", "kwargs", "argument", "source"), [
    (lambda: tt.TransformerEncoderLayer(8, 2, 16), {"src": torch.randn(1, 3, 8).double()}, "src",
     "the module's parameters"),
    (lambda: tt.TransformerDecoder(tt.TransformerDecoderLayer(8, 2, 16), 1),
     {"tgt": torch.randn(1, 3, 8), "memory": torch.randn(1, 2, 8).double()}, "memory", "tgt"),
    (lambda: tt.Transformer(8, 2, 1, 1, 16), {"src": torch.randn(1, 2, 8), "tgt": torch.randn(1, 3, 8).double()},
     "tgt", "src"),
    (lambda: tt.FeedForward(8, 16), {"x": torch.randn(1, 3, 8).double()}, "x", "the module's parameters"),
])
def test_every_layer_names_an_input_of_the_wrong_dtype(module: Any, kwargs: dict[str, Tensor], argument: str,
                                                      source: str) -> None:
    with tt.strict_checks(False), pytest.raises(ShapeError) as info:
        module()(**kwargs)
    assert (info.value.argument, info.value.reason) == (argument, f"dtype is float64, expected float32 (the dtype of "
                                                                  f"{source})")


def test_a_module_in_double_precision_takes_double_inputs() -> None:
    m = MultiHeadAttention(8, 2, dtype=torch.float64)
    assert m(torch.randn(2, 3, 8, dtype=torch.float64))[0].dtype == torch.float64
    # A float additive mask of another dtype is not an input to the projections: still accepted.
    out, _ = m(torch.randn(2, 3, 8, dtype=torch.float64), attn_mask=torch.zeros(3, 3))
    assert out.dtype == torch.float64


def test_tensors_on_another_device() -> None:
    # Reported: q on the CPU and k, v on the meta device silently returned a meta tensor.
    q, k, v = qkv(b=1, h=2, t=3, d=4)
    with pytest.raises(ShapeError) as info:
        scaled_dot_product_attention(q, k.to("meta"), v.to("meta"))
    assert info.value.summary == f"{SDPA}(): k: device is meta, expected cpu (the device of q)"
    m = MultiHeadAttention(8, 2)
    with pytest.raises(ShapeError) as info:
        m(torch.randn(1, 3, 8, device="meta"))
    assert info.value.summary == f"{MHA}(): query: device is meta, expected cpu (the device of the module's parameters)"


def test_same_dtype_must_name_a_parameter() -> None:
    def f(x: Float[Tensor, " n"]) -> Float[Tensor, " n"]:
        return x

    with pytest.raises(TypeError, match="has no parameter 'y'"):
        typechecked(f, same_dtype=("y",))


def test_a_kv_cache_from_another_model_is_refused_where_it_enters_in_default_mode() -> None:
    # The outer signature (GPT.forward) does not describe a cache's contents; the cache checks what it is given.
    small = tt.GPT(tt.GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8))
    other = tt.GPT(tt.GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, n_embd=8))
    caches = other.new_caches()
    other(torch.ones(1, 3, dtype=torch.long), kv_caches=caches)
    with tt.strict_checks(False), pytest.raises(ShapeError) as info:
        small(torch.ones(1, 1, dtype=torch.long), kv_caches=caches)
    assert info.value.summary == ("typed_transformer.multihead.KVCache.append(): k: is (1, 2, 1, 4), but the cache "
                                  "holds (1, 4, 3, 2) (b, g and the head size must stay the same)")
