"""The compiled fast path of the shape checks gives jaxtyping + beartype's verdict, and the same error.

``typed_transformer.shapecheck`` checks most calls with a plan compiled from the annotations; the full
jaxtyping + beartype check runs only when the plan finds (or suspects) a problem. These tests call the
same functions with random arguments, once through the fast path and once with it switched off, and
require the same outcome: both pass, or both raise the same ``ShapeError``.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from jaxtyping import Bool, Float, Int, Shaped
from torch import Tensor

from typed_transformer import shapecheck
from typed_transformer.shapecheck import ShapeError, typechecked

RETURN: list[Any] = [None]  # what the functions under test return: drawn per example


def attention_like(
    q: Float[Tensor, "b h t d"],
    k: Float[Tensor, "b g s d"],
    mask: Bool[Tensor, "#b #h #t s"] | Float[Tensor, "t s"] | None = None,
    *,
    n: int = 1,
    scale: float | None = None,
    mode: Literal["a", "b"] = "a",
) -> Float[Tensor, "b h t d"]:
    return RETURN[0]  # type: ignore[no-any-return]


class Module:
    width = 3

    def forward(self, x: Float[Tensor, "b t {self.width}"], ids: Int[Tensor, "b _"] | None = None
                ) -> tuple[Float[Tensor, "b t {self.width}"], Shaped[Tensor, " b"] | None]:
        return RETURN[0]  # type: ignore[no-any-return]


def symbolic(x: Int[Tensor, "b t"], steps: int, flags: list[bool] | None = None) -> Int[Tensor, "b t+{steps}"]:
    return RETURN[0]  # type: ignore[no-any-return]


def fixed(x: Shaped[Tensor, "2 n"], y: Float[Tensor, "n 1"] | Int[Tensor, " n"]) -> None:
    return RETURN[0]  # type: ignore[no-any-return]


attention_like = typechecked(attention_like)
Module.forward = typechecked(Module.forward)  # type: ignore[method-assign]
symbolic = typechecked(symbolic)
fixed = typechecked(fixed)

DTYPES = [torch.float32, torch.float64, torch.int64, torch.bool]


def tensors(max_ndim: int = 5) -> st.SearchStrategy[Tensor]:
    return st.builds(lambda shape, dtype: torch.zeros(shape, dtype=dtype),
                     st.lists(st.sampled_from([1, 2, 3]), max_size=max_ndim).map(tuple), st.sampled_from(DTYPES))


def values() -> st.SearchStrategy[Any]:
    """Mostly tensors, sometimes the wrong kind of thing altogether."""
    return st.one_of(tensors(), tensors(), tensors(), st.sampled_from([None, 3, 1.5, True, "x", [True], [1]]))


@contextmanager
def full_path_only() -> Iterator[None]:
    previous, shapecheck._fast_path = shapecheck._fast_path, False
    try:
        yield
    finally:
        shapecheck._fast_path = previous


def outcome(call: Callable[[], Any]) -> str:
    try:
        call()
    except ShapeError as err:
        return f"ShapeError: {err}"
    except TypeError as err:  # wrong arity and the like: Python's own error, before any check
        return f"TypeError: {err}"
    return "passes"


def same_verdict(call: Callable[[], Any]) -> str:
    fast = outcome(call)
    with full_path_only():
        full = outcome(call)
    assert fast == full
    return fast


def test_the_functions_under_test_have_plans() -> None:
    """Otherwise the comparisons below would compare the full path with itself."""
    assert shapecheck._fast_path
    for fn in (attention_like, Module.forward, symbolic, fixed):
        assert fn.__closure__ is not None
        plans = [c.cell_contents for c in fn.__closure__ if isinstance(c.cell_contents, shapecheck._Plan)]
        assert len(plans) == 1, fn


@given(q=values(), k=values(), mask=st.one_of(st.none(), values()), n=st.sampled_from([1, True, 1.5, "2"]),
       scale=st.sampled_from([None, 0.5, 2, True, "x"]), mode=st.sampled_from(["a", "b", "c"]), out=values())
def test_attention_like(q: Any, k: Any, mask: Any, n: Any, scale: Any, mode: Any, out: Any) -> None:
    RETURN[0] = out
    same_verdict(lambda: attention_like(q, k, mask, n=n, scale=scale, mode=mode))


@given(x=values(), ids=st.one_of(st.none(), values()), width=st.sampled_from([1, 2, 3]),
       out=st.one_of(st.tuples(values(), st.one_of(st.none(), values())), values()))
def test_f_string_axes_and_tuple_returns(x: Any, ids: Any, width: int, out: Any) -> None:
    module = Module()
    module.width = width
    RETURN[0] = out
    same_verdict(lambda: module.forward(x, ids))
    same_verdict(lambda: module.forward(x=x, ids=ids))


@given(x=values(), steps=st.sampled_from([0, 1, 2, -1, "1"]), flags=st.sampled_from([None, [], [True], [1], (True,)]),
       out=values())
def test_symbolic_axes(x: Any, steps: Any, flags: Any, out: Any) -> None:
    RETURN[0] = out
    same_verdict(lambda: symbolic(x, steps, flags))


@given(x=values(), y=values(), out=st.sampled_from([None, 0]))
def test_fixed_axes_and_dtype_alternatives(x: Any, y: Any, out: Any) -> None:
    RETURN[0] = out
    same_verdict(lambda: fixed(x, y))


@given(data=st.data())
def test_matching_shapes_pass_on_both_paths(data: st.DataObject) -> None:
    """The random draws above mostly fail; here the arguments are built to fit, so passing is covered too."""
    b, h, g, t, s, d = (data.draw(st.integers(1, 3)) for _ in range(6))
    assume(h % g == 0)
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64]))
    q, k = torch.zeros(b, h, t, d, dtype=dtype), torch.zeros(b, g, s, d, dtype=dtype)
    mask = data.draw(st.sampled_from([None, torch.ones(1, h, t, s, dtype=torch.bool),
                                      torch.ones(b, 1, 1, s, dtype=torch.bool), torch.zeros(t, s)]))
    RETURN[0] = torch.zeros(b, h, t, d)
    assert same_verdict(lambda: attention_like(q, k, mask, n=2, scale=0.5, mode="b")) == "passes"
    RETURN[0] = torch.zeros(b, t + 2, dtype=torch.long)
    assert same_verdict(lambda: symbolic(torch.zeros(b, t, dtype=torch.long), 2, [True])) == "passes"


def test_a_wrong_return_is_explained_the_same_way() -> None:
    RETURN[0] = torch.zeros(2, 4, 3, 8)
    message = same_verdict(lambda: attention_like(torch.zeros(2, 4, 3, 8), torch.zeros(2, 2, 5, 7)))
    assert message.startswith(f"ShapeError: {__name__}.attention_like(): k: axis d is 7, expected 8 (bound by q)")
    message = same_verdict(lambda: attention_like(torch.zeros(2, 4, 3, 7), torch.zeros(2, 2, 5, 7)))
    assert message.startswith(f"ShapeError: {__name__}.attention_like(): return value: axis d is 8, expected 7 "
                              "(bound by q)")


@pytest.mark.parametrize("hint", [Callable[[int], int], dict[str, int], tuple[int, ...], complex])
def test_unmodelled_hints_keep_the_full_check(hint: Any) -> None:
    def f(x: Float[Tensor, " n"], y: Any) -> None:
        return None

    f.__annotations__["y"] = hint
    checked = typechecked(f)
    assert checked.__closure__ is not None
    assert not any(isinstance(c.cell_contents, shapecheck._Plan) for c in checked.__closure__)
