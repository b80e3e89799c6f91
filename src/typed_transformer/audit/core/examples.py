"""One drawn example of a check (its inputs, masks and sizes), the error measure and tolerance bound it is judged by,
and how a failing example is written back as runnable code."""

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from einops import repeat
from torch import Tensor

from ...shapecheck import shape_checked
from ...strategies import randn
from .conventions import DTYPES_BY_NAME, Inputs, KeepMask

# ----------------------------------------------------------------------------------------------------
# Repro snippets
# ----------------------------------------------------------------------------------------------------


def import_line(obj: Any, as_name: str, *, search: tuple[str, ...] = ()) -> str | None:
    """A line that binds ``obj`` to ``as_name`` in a fresh interpreter (``from pkg.mod import NAME as as_name``),
    or None when it cannot be imported: defined in ``__main__``, inside a function, or not found under its name.
    A function or class is found by its qualified name; any other object (a spec) by a module-level name, in
    the modules ``search`` first."""
    import sys

    isolated = getattr(obj, "isolated_target", None)  # a candidate in its own process: imported there by name
    if isinstance(isolated, tuple):
        module_name, qualname = isolated
        top, _, rest = qualname.partition(".")
        return f"from {module_name} import {top}\n{as_name} = {qualname}" if rest else \
            f"from {module_name} import {top} as {as_name}"
    main = sys.modules.get("__main__")
    # the script run (and its aliases, such as multiprocessing's __mp_main__) cannot be imported by name
    scripts = {"__main__", *(name for name, module in list(sys.modules.items()) if module is main)}
    module_name, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module_name, str) and isinstance(qualname, str) and "<" not in qualname:
        found: Any = sys.modules.get(module_name)
        for part in qualname.split("."):
            found = getattr(found, part, None)
        if found is obj and module_name not in scripts:
            top, _, rest = qualname.partition(".")
            return f"from {module_name} import {top}\n{as_name} = {qualname}" if rest else \
                f"from {module_name} import {top} as {as_name}"
    # the modules named first, then every imported module (in import order: the defining one comes first)
    for name in (*search, *list(sys.modules)):
        namespace = getattr(sys.modules.get(name), "__dict__", None) if name not in scripts else None
        for attr, value in list((namespace or {}).items()):
            if value is obj and not attr.startswith("__"):
                return f"from {name} import {attr} as {as_name}"
    return None


def repro_comparison(check: str) -> str:
    """The repro's last lines: the candidate's output against the float64 reference (for ``gradients``: the
    gradients of both, against one seeded output gradient, and their differences)."""
    if check == "gradients":
        return ("def leaves(dtype):  # the inputs as leaves in dtype (one tensor for all three with one input)\n"
                "    xs = [x.to(dtype).requires_grad_(True) for x in example.inputs()[:1 if example.tied else 3]]\n"
                "    return xs, tuple(xs * 3 if example.tied else xs)\n"
                "theirs, ins = leaves(example.torch_dtype)\n"
                "out = adapter.call(ins, example.mask(), example.is_causal, example.torch_dtype)\n"
                "ours, ins = leaves(torch.float64)\n"
                "ref = adapter.reference(ins, example.mask(), example.is_causal, torch.float64)\n"
                "cotangent = torch.randn(tuple(ref.shape), generator=torch.Generator().manual_seed(example.seed + 4), "
                "dtype=torch.float64)\n"
                "(ref.nan_to_num(0.0) * cotangent).sum().backward()\n"
                "(out.double().nan_to_num(0.0) * cotangent).sum().backward()\n"
                "errors = {n: float((b.grad.double() - a.grad).abs().max()) for n, a, b in zip(('x', 'key', 'value'), "
                "ours, theirs)}\n"
                "print('gradient errors', errors)\n"
                f"print('max error', max(errors.values()))  # check {check}")
    return (f"out = adapter.call(example.inputs(), example.mask(), example.is_causal, example.torch_dtype)\n"
            f"ref = adapter.reference(example.inputs(), example.mask(), example.is_causal, torch.float64)\n"
            f"print('max error', float((out.double() - ref).abs().max()))  # check {check}")


# ----------------------------------------------------------------------------------------------------
# Examples
# ----------------------------------------------------------------------------------------------------


@shape_checked
@dataclass(frozen=True)
class Example:
    """One audit input: sizes, seed, dtype, mask and flags; :meth:`inputs` rebuilds the tensors exactly.

    ``widths`` (modules only) are the query, key and value input widths: the inputs are then ``x (b, t, eq)``,
    ``key (b, s, ek)``, ``value (b, s, ev)`` (one tensor for all three with ``tied``). ``keep`` is the
    keep-mask ``(b, 1 or h, t, s)`` as nested lists; ``amplitude`` multiplies queries and keys (modules: the
    inputs), to reach large logits. ``ramp`` scales key position ``j`` (a tied module: input position ``j``) by
    ``1 + ramp * j / (s - 1)``: the largest logit of a row then tends to come late, so that a running maximum
    grows from one block of keys to the next (what a tiled kernel that forgets to rescale gets wrong). ``shift`` is
    added to the values (the long rows past 512 keys): the output is then near ``shift`` rather than an average of
    thousands of centred values near zero, so that a relative error in a running sum shows at the output's own
    resolution. ``repeat`` (inference's probes of a kernel that takes lengths in multiples of a block only) repeats
    every query and key position ``repeat`` times in the tensors and the mask: ``t`` and ``s`` are the drawn
    positions, the tensors hold ``t * repeat`` and ``s * repeat``. The last query of each block then computes exactly
    what its position computes without the repeats, under either causal alignment (each key it sees, it sees in all
    ``repeat`` copies, whose equal weights cancel in the softmax).
    """

    b: int
    h: int
    g: int
    t: int
    s: int
    d: int
    dv: int
    seed: int
    dtype: str = "float32"
    keep: Any = None
    is_causal: bool = False
    amplitude: float = 1.0
    widths: tuple[int, int, int] | None = None
    tied: bool = False
    ramp: float = 0.0
    shift: float = 0.0
    repeat: int = 1

    __shape_checked__ = ("mask", "inputs")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES_BY_NAME[self.dtype]

    def mask(self) -> KeepMask | None:
        """The keep-mask as a boolean tensor (or None)."""
        if self.keep is None:
            return None
        keep = torch.tensor(self.keep, dtype=torch.bool)
        return keep if self.repeat == 1 else repeat(keep, "b h t s -> b h (t r) (s c)", r=self.repeat, c=self.repeat)

    def inputs(self) -> Inputs:
        """Float64 inputs: ``q (b,h,t,d)``, ``k (b,g,s,d)``, ``v (b,g,s,dv)`` (modules: see ``widths``; with
        ``repeat``, each position repeated)."""
        drawn = self._drawn()
        if self.repeat == 1:
            return drawn
        q, k, v = (repeat(x, "... n e -> ... (n r) e", r=self.repeat) for x in drawn)
        return (q, q, q) if drawn[1] is drawn[0] else (q, k, v)  # one tensor for all three stays one

    def _drawn(self) -> Inputs:
        ramp = 1.0 + self.ramp * torch.arange(self.s, dtype=torch.float64)[:, None] / max(self.s - 1, 1)
        if self.widths is not None:
            eq, ek, ev = self.widths
            x = randn((self.b, self.t, eq), self.seed) * self.amplitude
            if self.tied:
                return (x * ramp,) * 3 if self.ramp else (x, x, x)
            key = randn((self.b, self.s, ek), self.seed + 1) * self.amplitude * ramp
            return x, key, randn((self.b, self.s, ev), self.seed + 2) + self.shift
        q = randn((self.b, self.h, self.t, self.d), self.seed) * self.amplitude
        k = randn((self.b, self.g, self.s, self.d), self.seed + 1) * self.amplitude * ramp
        v = randn((self.b, self.g, self.s, self.dv), self.seed + 2) + self.shift
        return q, k, v


def example_fields(example: Example) -> dict[str, Any]:
    """The counterexample as the report prints it: ``ramp`` only where the keys grow (a deep length), ``shift`` only
    where values are shifted (past 512 keys), ``repeat`` only where positions repeat (inference's probes of a kernel
    of whole blocks)."""
    fields = dataclasses.asdict(example)
    for name, plain in (("ramp", 0.0), ("shift", 0.0), ("repeat", 1)):
        if fields[name] == plain:
            del fields[name]
    return fields


def mask_to_list(mask: Tensor | None) -> Any:
    return None if mask is None else mask.tolist()


# ----------------------------------------------------------------------------------------------------
# Tolerance
# ----------------------------------------------------------------------------------------------------


def bound(ref64: Tensor, reflow: Tensor, tolerance: float, dtype: torch.dtype, *, rows: Tensor | None = None,
          floor_ulps: float = 2.0, amplification: float = 1.0, length: int = 1) -> tuple[float, float]:
    """``(allowed error, base)`` by the FlashAttention rule, over ``rows`` only.

    ``base`` is the larger of the reference's own error in ``dtype`` (``max|reflow - ref64|``) and a floor:
    ``floor_ulps`` units in the last place of ``dtype`` at ``max(1, max|ref|)``, times ``length`` (the longest
    sum: ``s + d``; a correct sum of ``n`` terms may round ``n`` times) and times ``amplification`` (the
    largest ``|q| . |k| * scale``: a rounding error in a logit ``x`` changes ``exp(x)`` by ``x`` times as
    much). The floor is what matters in float64, where ``reflow`` is ``ref64`` itself. Allowed error:
    ``tolerance * base``.
    """
    ref64, reflow = ref64.detach().double(), reflow.detach().double()
    both = torch.isfinite(ref64) & torch.isfinite(reflow)
    if rows is not None:
        both = both & rows.expand_as(both)
    diff = (reflow - ref64).abs().masked_fill(~both, 0.0)
    scale_ = ref64.abs().masked_fill(~both, 0.0)
    measured = float(diff.max()) if diff.numel() else 0.0
    floor = floor_ulps * torch.finfo(dtype).eps * max(float(scale_.max()) if scale_.numel() else 0.0, 1.0)
    floor *= max(amplification, 1.0) * max(length, 1)
    base = max(measured, floor)
    return tolerance * base, base


def error(out: Tensor, expected: Tensor, rows: Tensor | None = None) -> float:
    """``max|out - expected|`` (in ``rows``); NaN must match NaN exactly, any other non-finite value is an
    infinite error."""
    out, expected = out.detach().double(), expected.detach().double()
    if out.shape != expected.shape:
        return math.inf
    if rows is not None:
        rows = rows.expand_as(out)
        out, expected = out[rows], expected[rows]
    if out.numel() == 0:
        return 0.0
    want_nan = expected.isnan()
    if not torch.equal(out.isnan(), want_nan):
        return math.inf
    out, expected = out[~want_nan], expected[~want_nan]
    if not torch.isfinite(out).all():
        return math.inf
    return float((out - expected).abs().max()) if out.numel() else 0.0
