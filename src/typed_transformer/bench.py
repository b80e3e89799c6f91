"""Benchmarks that print ratios measured side by side in one process.

``typed-transformer bench attention`` times our :class:`MultiHeadAttention` (shape checks on and off,
reference and sdpa paths) against ``torch.nn.MultiheadAttention`` with the same weights. Variants are
interleaved round-robin and each is reported by its median, so that machine noise hits all of them
alike; the ratios are the figures to read, not the absolute milliseconds.
"""

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .multihead import MultiHeadAttention
from .shapecheck import shape_checks

__all__ = ["AttentionCase", "bench_attention", "format_attention_table"]


@dataclass(frozen=True)
class AttentionCase:
    """One benchmark size: batch ``b``, sequence ``t``, width ``d_model``, heads ``h``."""

    name: str
    b: int
    t: int
    d_model: int
    h: int


SMALL = AttentionCase("small", b=1, t=4, d_model=64, h=4)
TRAINING = AttentionCase("training", b=8, t=256, d_model=384, h=6)


@dataclass
class Row:
    case: AttentionCase
    variant: str
    mode: str
    median_ms: float
    ratio: float  # median time / torch's median time in the same case and mode


def _median_ms(fn: Callable[[], object], rounds: int, inner: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) * 1e3 / inner)
    return samples


def _variants(case: AttentionCase, x: Tensor) -> dict[str, tuple[nn.Module, Callable[[nn.Module], Tensor], bool]]:
    """name -> (module, call, checks on?)"""
    torch.manual_seed(0)
    reference = nn.MultiheadAttention(case.d_model, case.h, batch_first=True)
    sdpa = MultiHeadAttention.from_torch(reference, backend="sdpa")
    einsum = MultiHeadAttention.from_torch(reference, backend="reference")

    def call_torch(m: nn.Module) -> Tensor:
        out: Tensor = m(x, x, x, need_weights=False)[0]
        return out

    def call_ours(m: nn.Module) -> Tensor:
        out: Tensor = m(x)[0]
        return out

    return {
        "torch nn.MultiheadAttention": (reference, call_torch, True),
        "ours sdpa, checks on": (sdpa, call_ours, True),
        "ours sdpa, checks off": (sdpa, call_ours, False),
        "ours reference, checks on": (einsum, call_ours, True),
        "ours reference, checks off": (einsum, call_ours, False),
    }


def bench_attention(cases: list[AttentionCase] | None = None, *, seconds: float = 2.0) -> list[Row]:
    """Time forward (eval, no_grad) and forward+backward (train mode) for every variant and case.

    ``seconds`` is the rough time budget per case and mode, split over interleaved rounds.
    """
    rows: list[Row] = []
    for case in cases or [SMALL, TRAINING]:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(case.b, case.t, case.d_model, generator=generator)
        variants = _variants(case, x)
        for mode in ("forward", "forward+backward"):
            def step(module: nn.Module, call: Callable[[nn.Module], Tensor], checks: bool,
                     mode: str = mode) -> None:
                with shape_checks(checks):
                    if mode == "forward":
                        module.eval()
                        with torch.no_grad():
                            call(module)
                    else:
                        module.train()
                        call(module).sum().backward()  # type: ignore[no-untyped-call]

            # Calibrate: how many calls fit in one round (a round is about 1/20 of the budget per variant).
            first = next(iter(variants.values()))
            for _ in range(3):
                step(*first)
            start = time.perf_counter()
            step(*first)
            once = max(time.perf_counter() - start, 1e-6)
            rounds = 15
            inner = max(1, int(seconds / (rounds * len(variants) * once)))
            samples: dict[str, list[float]] = {name: [] for name in variants}
            for variant in variants.values():  # warm-up
                for _ in range(2):
                    step(*variant)
            for _ in range(rounds):
                for name, (module, call, checks) in variants.items():
                    samples[name] += _median_ms(functools.partial(step, module, call, checks), 1, inner)
            base = statistics.median(samples["torch nn.MultiheadAttention"])
            for name in variants:
                median = statistics.median(samples[name])
                rows.append(Row(case, name, mode, median, median / base))
    return rows


def format_attention_table(rows: list[Row]) -> str:
    lines = [
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of interleaved rounds; "
        "ratio = time / torch's time",
        "",
        f"{'size':<34} {'variant':<28} {'forward ms':>11} {'ratio':>6} {'fwd+bwd ms':>11} {'ratio':>6}",
    ]
    by_key = {(r.case.name, r.variant, r.mode): r for r in rows}
    seen: list[tuple[AttentionCase, str]] = []
    for r in rows:
        if (r.case, r.variant) not in seen:
            seen.append((r.case, r.variant))
    for case, variant in seen:
        f, fb = by_key[(case.name, variant, "forward")], by_key[(case.name, variant, "forward+backward")]
        size = f"{case.name} (b={case.b}, t={case.t}, d={case.d_model}, h={case.h})"
        lines.append(f"{size:<34} {variant:<28} {f.median_ms:>11.3f} {f.ratio:>5.2f}x "
                     f"{fb.median_ms:>11.3f} {fb.ratio:>5.2f}x")
    training = [r for r in rows if r.case.name == TRAINING.name]
    if training:
        def get(variant: str, mode: str) -> float:
            return by_key[(TRAINING.name, variant, mode)].median_ms

        lines.append("")
        for mode in ("forward", "forward+backward"):
            sdpa_ratio = get("ours sdpa, checks on", mode) / get("torch nn.MultiheadAttention", mode)
            overhead = get("ours sdpa, checks on", mode) / get("ours sdpa, checks off", mode)
            lines.append(f"training size, {mode:<16}: sdpa path with checks / torch = {sdpa_ratio:.3f}x "
                         f"(target <= 1.10x); checks on / off = {overhead:.3f}x (target < 1.05x)")
    return "\n".join(lines)
