"""A known-answer self-test of the reference, run before every audit.

The reference computes with torch, einops and this library, in the candidate's own process, so a candidate (or code
imported with it) can change what it computes: :mod:`.trusted` holds the functions it calls by name, and this test
covers everything else they reach. Each case runs the reference (and the comparison's error measure) on fixed
inputs, built from ``sin`` over a grid (no random generator, whose stream a candidate could move), under one
convention the reference models, and compares the result with float64 values stored when the file
``known_answers.json`` beside this module was written (``benchmarks/known_answers.py --write``; a test checks
them against torch's own ``F.scaled_dot_product_attention`` and a written-out softmax). A case that differs stops
the audit: the reference no longer computes what it computed, so no verdict of it could be trusted. About 10 ms.
"""

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch
from einops import rearrange
from torch import Tensor

from .conventions import Conventions
from .examples import error
from .reference import reference_attention, rotate

#: where the stored values are (written by benchmarks/known_answers.py --write)
STORED_PATH = Path(__file__).with_name("known_answers.json")
#: a case's values match when every one is within this of the stored (float64 rounding across machines is far less)
TOLERANCE = 1e-10


def grid(*shape: int, phase: float) -> Tensor:
    """Fixed float64 values in [-1, 1]: ``sin(0.731 i + phase)`` over the elements in order."""
    n = math.prod(shape)
    return torch.sin(torch.arange(n, dtype=torch.float64) * 0.731 + phase).reshape(shape)


def _qkv(h: int = 2, g: int = 2, t: int = 3, s: int = 4, d: int = 4, dv: int = 3) -> tuple[Tensor, Tensor, Tensor]:
    return grid(1, h, t, d, phase=0.1), grid(1, g, s, d, phase=0.2), grid(1, g, s, dv, phase=0.3)


def _keep(t: int, s: int, *, dead_row: bool) -> Tensor:
    keep = grid(1, 1, t, s, phase=0.4) > -0.3
    keep[..., 0] = True
    if dead_row:
        keep[..., 0, :] = False
    return keep


def _cases() -> dict[str, Callable[[], Tensor]]:
    """Each case: what it computes (canonical ``(b, h, t, dv)`` outputs, or one error as a 1-element tensor)."""
    return {
        "plain": lambda: reference_attention(*_qkv()),
        "scale 0.5": lambda: reference_attention(*_qkv(), conventions=Conventions(scale=0.5)),
        "causal, bottom-right, t < s": lambda: reference_attention(*_qkv(t=2), is_causal=True),
        "causal, top-left, t < s": lambda: reference_attention(
            *_qkv(t=2), is_causal=True, conventions=Conventions(causal_alignment="top-left")),
        "causal, bottom-right, t > s (a row without keys: zeros)": lambda: reference_attention(
            *_qkv(t=4, s=3), is_causal=True),
        "keep-mask with a fully masked row (zeros)": lambda: reference_attention(
            *_qkv(), _keep(3, 4, dead_row=True)),
        "keep-mask with a fully masked row (uniform)": lambda: reference_attention(
            *_qkv(), _keep(3, 4, dead_row=True), conventions=Conventions(fully_masked="uniform")),
        "grouped-query, 4 heads on 2": lambda: reference_attention(*_qkv(h=4)),
        "additive bias": lambda: reference_attention(*_qkv(), bias=grid(1, 2, 3, 4, phase=0.5)),
        "soft-capped at 0.5, mask": lambda: reference_attention(*_qkv(), _keep(3, 4, dead_row=False), softcap=0.5),
        "rotary, half": lambda: rotate(grid(1, 2, 3, 4, phase=0.6), 10000.0, "half"),
        "rotary, interleaved, offset 2": lambda: rotate(grid(1, 2, 3, 4, phase=0.6), 10000.0, "interleaved", 2),
        "error, NaN where NaN is": lambda: torch.tensor([error(
            torch.tensor([1.0, math.nan, 3.0], dtype=torch.float64), torch.tensor([1.5, math.nan, 2.0]))]),
    }


def compute() -> dict[str, list[float]]:
    """Every case's values, flattened."""
    return {name: rearrange(case().double(), "... -> (...)").tolist() for name, case in _cases().items()}


def stored() -> dict[str, list[float]]:
    values: dict[str, list[float]] = json.loads(STORED_PATH.read_text())
    return values


def self_test() -> list[str]:
    """The cases whose values differ from the stored ones, each as ``name (largest difference)``; [] when the
    reference computes what it computed."""
    want = stored()
    differ = []
    for name, got in compute().items():
        expected = want.get(name)
        if expected is None or len(expected) != len(got):
            differ.append(f"{name} (gives {len(got)} values, {0 if expected is None else len(expected)} stored)")
            continue
        gap = max((abs(a - b) if not (math.isnan(a) and math.isnan(b)) else 0.0 for a, b in zip(got, expected,
                                                                                             strict=True)),
                  default=0.0)
        if not gap <= TOLERANCE:  # NaN where a number was stored counts as different
            differ.append(f"{name} (differs by {gap:.3g})")
    return differ


def write() -> dict[str, list[float]]:
    """Store the values computed now (for ``benchmarks/known_answers.py --write``)."""
    values = compute()
    STORED_PATH.write_text("{\n" + ",\n".join(f"  {json.dumps(name)}: {json.dumps(v)}" for name, v in values.items())
                           + "\n}\n")
    return values
