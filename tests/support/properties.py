"""Test-only helpers shared by both suites: tolerances, message patterns, seeded inputs, independent masks, torch
switches."""

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar

import torch
from hypothesis import settings
from torch import Tensor

from typed_transformer import ShapeError

P = ParamSpec("P")
R = TypeVar("R")

#: float64 comparisons with torch: both sides compute the same sums in a different order.
F64: dict[str, float] = {"atol": 1e-10, "rtol": 1e-10}
#: Two computations that should agree to the last few bits (same inputs, different but exact routes).
EXACTISH: dict[str, float] = {"atol": 1e-12, "rtol": 1e-12}
#: Low-precision outputs against the float32 computation of the same (already rounded) inputs, rounded
#: once to the output dtype: the two may differ by one unit in the last place (rtol = 2**-mantissa bits).
#: Computing the softmax in the low precision itself is off by several units, which this catches.
HALF: dict[torch.dtype, dict[str, float]] = {
    torch.bfloat16: {"atol": 1e-5, "rtol": 2**-7},
    torch.float16: {"atol": 1e-5, "rtol": 2**-10},
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float64: F64,
}
#: The same for torch's fused kernels, which round the weights to the input dtype before multiplying
#: them with the values: an absolute error of about one unit at the size of the values (~1).
HALF_FUSED: dict[torch.dtype, dict[str, float]] = {
    torch.bfloat16: {"atol": 2**-7, "rtol": 2**-7},
    torch.float16: {"atol": 2**-10, "rtol": 2**-10},
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float64: F64,
}


def exactly(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern for the whole message, not a substring of it."""
    return f"^{re.escape(message)}$"


def seeded_randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> Tensor:
    """Standard normal values of ``shape`` from a generator of their own seeded with ``seed`` (float64 by
    default); the global random state is untouched."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def more_examples(factor: int) -> settings:
    """Settings for a central, cheap test: the active profile's ``max_examples`` times ``factor``."""
    return settings(max_examples=settings().max_examples * factor)


def fewer_examples(divisor: int) -> settings:
    """Settings for an expensive test: the active profile's ``max_examples`` divided by ``divisor``."""
    return settings(max_examples=max(5, settings().max_examples // divisor))


def assert_close(actual: Tensor, expected: Tensor, tolerance: dict[str, float] = F64, **kwargs: Any) -> None:
    """``torch.testing.assert_close`` with explicit tolerances (float64 ones by default)."""
    torch.testing.assert_close(actual, expected, atol=tolerance["atol"], rtol=tolerance["rtol"], **kwargs)


def bottom_right_causal(t: int, s: int) -> Tensor:
    """Keep-mask ``(t, s)``: query ``i`` may attend key ``j`` iff ``j <= i + (s - t)``, built from the
    definition (independently of ``typed_transformer.masks.causal_mask``)."""
    i = torch.arange(t).reshape(t, 1)
    j = torch.arange(s).reshape(1, s)
    return j <= i + (s - t)


def allow_diagonal(mask: Tensor, t: int, s: int) -> Tensor:
    """Copy of ``mask`` (bool keep-mask or float additive mask, last axes ``(t, s)``) in which every query
    ``i`` may attend key ``i + (s - t)`` when that key exists, so that no row is fully masked once a
    bottom-right causal mask is ANDed in (rows ``i < t - s`` have no key under causality anyway)."""
    mask = mask.clone()
    for i in range(t):
        j = i + s - t
        if 0 <= j < s:
            if mask.dtype == torch.bool:
                mask[..., i, j] = True
            else:
                column = mask[..., i, j]
                mask[..., i, j] = torch.where(torch.isinf(column), torch.zeros_like(column), column)
    return mask


def keep_of(mask: Tensor | None) -> Tensor | None:
    """The keep-mask implied by a bool or float mask (a float entry of ``-inf`` removes the key)."""
    if mask is None or mask.dtype == torch.bool:
        return mask
    return mask > float("-inf")


@contextlib.contextmanager
def mha_fastpath(enabled: bool) -> Iterator[None]:
    """Switch torch's ``nn.MultiheadAttention`` fast path on or off, restoring the setting afterwards."""
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)


@contextlib.contextmanager
def count_native_mha_calls() -> Iterator[list[int]]:
    """Count calls of ``torch._native_multi_head_attention`` (the MHA fast path) inside the block.

    ``nn.MultiheadAttention.forward`` looks the function up on the ``torch`` module at call time, so a
    wrapper installed here sees every fast-path call. Yields a list that gets one entry per call.
    """
    original = torch._native_multi_head_attention
    calls: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    torch._native_multi_head_attention = counting
    try:
        yield calls
    finally:
        torch._native_multi_head_attention = original


def call_valid(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Call ``fn`` on arguments the library must accept; a ShapeError becomes a plain AssertionError.

    The re-raise happens outside the ``except`` block on purpose: ShapeError's chain of causes is not
    the same on every call (jaxtyping/beartype internals), which Hypothesis would report as a flaky test.
    """
    try:
        return fn(*args, **kwargs)
    except ShapeError as err:
        message = str(err)
    raise AssertionError(f"a valid call raised ShapeError:\n{message}")
