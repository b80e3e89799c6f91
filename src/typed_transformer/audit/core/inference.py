"""Infer a candidate's conventions from its behaviour: a handful of small, deterministic probes (sizes <= 8, in
float64; in the first of float32, float16 and bfloat16 a candidate accepts when it refuses float64, and with
dv = d when it refuses dv != d, each refusal listed), each compared with the reference under every documented
convention.

A behaviour becomes a convention only when it matches one documented convention exactly on every probe; anything
else (an argument accepted and ignored, a mask that masks under no polarity, a scale that depends on the head
count, a causal mask that matches neither alignment, a fully masked row that is neither zeros, NaN nor the mean of
the values) is a *finding*, and an audit under the inferred conventions FAILs with it. Each decision keeps the
smallest input that decided it, printable as a runnable repro.
"""

import dataclasses
import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .conventions import DEFAULT_CONVENTIONS, Conventions
from .examples import Example, error, example_fields
from .reference import reference_attention
from .report import PAPER, Adapter, AuditReport, CheckResult, Difference
from .running import CandidateRaised, CheckFailure, candidate_code

#: the relative error within which a probe's output matches the reference, by the probes' dtype: float64 probes
#: of a candidate computing in float32 inside still match; half-precision probes round inputs and output
_RTOL = {"float64": 1e-4, "float32": 1e-4, "float16": 1e-2, "bfloat16": 6e-2}
#: the relative error of a logit scale estimated from one probe, by dtype
_SCALE_RTOL = {"float64": 1e-3, "float32": 1e-3, "float16": 2e-2, "bfloat16": 6e-2}
#: the probes' dtypes, in the order tried: the first the candidate accepts is used
_PROBE_DTYPES = ("float64", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Evidence:
    """Why ``field`` was given ``value``: what was seen, on which input (``example``, called in ``conventions``)."""

    field: str
    value: Any
    seen: str
    example: Example | None = None
    conventions: Conventions | None = None
    repro: str = ""

    def __str__(self) -> str:
        return f"{self.field} = {self.value!r}: {self.seen}"


@dataclass(frozen=True)
class Finding:
    """A behaviour that matches no documented convention (``field`` names the convention it failed to be)."""

    field: str
    message: str
    example: Example | None = None
    repro: str = ""
    #: ``(field, value)``: the finding is no bug when the user declares that value (a boolean mask of
    #: nn.MultiheadAttention's polarity beside float masks): ``known`` with it removes the finding
    declarable: tuple[str, Any] | None = None

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass
class Inference:
    """What :func:`infer_conventions` found: ``conventions`` to audit with, ``evidence`` per decided field and
    ``findings`` (each one a FAIL of the audit). ``str(inference)`` lists them; ``seconds`` is how long it took."""

    candidate: str
    conventions: Conventions
    evidence: dict[str, Evidence] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    probes: int = 0
    seconds: float = 0.0
    #: inferred conventions that differ from the paper's attention (see :func:`with_differences`)
    differences: list[Difference] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The report's opening block: the differences from the paper's attention, then every inferred field
        with what decided it, then the findings."""
        out = []
        if self.differences:
            undeclared = sum(not d.declared for d in self.differences)
            out.append(f"differences from the paper's attention ({len(self.differences)}, {undeclared} not "
                       f"declared{': the audit does not pass until they are' if undeclared else ''}):")
            out += [f"  - {d.line()}" for d in self.differences]
        out.append(f"inferred conventions ({self.probes} probes, {self.seconds:.2g} s):")
        out += [f"  {e}" for e in self.evidence.values()]
        if self.findings:
            out.append("findings (behaviours that match no documented convention; each fails the audit):")
            out += [f"  - {f}" for f in self.findings]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


class _Prober:
    """Runs probes on one adapter, switching its conventions per probe."""

    def __init__(self, adapter: Adapter, seed: int) -> None:
        self.adapter = adapter
        self.seed = seed
        self.conv = adapter.conventions
        self.evidence: dict[str, Evidence] = {}
        self.findings: list[Finding] = []
        self.probes = 0
        #: whether the candidate may take ``enable_gqa`` (False: its signature has no such keyword)
        self.gqa_keyword = True
        #: the probes' dtype: float64, or the first of float32, float16 and bfloat16 a function accepts when it
        #: refuses float64 (float32 for a module that raises in float64: its float64 rows of the checks report that)
        self.dtype: str = "float64"
        #: the length of the square (t = s) probes: 3, or the one length a module takes (Swin's window of 2 x 2
        #: tokens: its declared ``lengths`` are (4, 4), the length of the mask probes of one input too)
        low, high = adapter.conventions.lengths
        self.square = low if low == high else 3

    # -- examples --------------------------------------------------------------------------------------

    def example(self, *, t: int, s: int, h: int = 2, g: int | None = None, d: int = 4, dv: int | None = None,
                b: int = 1, keep: Tensor | None = None, is_causal: bool = False, offset: int = 0) -> Example:
        fixed = self.adapter.fixed
        if fixed is None:
            if self.conv.head_size_multiple > 1:  # the candidate takes multiples of it only (see _accepted)
                d, dv = self.conv.head_size(d), None if dv is None else self.conv.head_size(dv)
            if self.conv.equal_head_sizes:  # the candidate refuses dv != d (see _accepted)
                dv = d
            return Example(b=b, h=h, g=h if g is None else g, t=t, s=s, d=d, dv=d if dv is None else dv,
                           seed=self.seed * 1000 + offset, dtype=self.dtype,
                           keep=None if keep is None else keep.tolist(), is_causal=is_causal,
                           repeat=self.conv.length_multiple)  # whole blocks: each position repeated (see call)
        tied = bool(fixed.get("tied"))
        return Example(b=b, h=fixed["h"], g=fixed["g"], t=t, s=t if tied else s, d=fixed["d"], dv=fixed["dv"],
                       seed=self.seed * 1000 + offset, dtype=self.dtype,
                       keep=None if keep is None else keep.tolist(), is_causal=is_causal,
                       widths=(fixed["eq"], fixed["ek"], fixed["ev"]), tied=tied)

    @property
    def tied(self) -> bool:
        return self.adapter.fixed is not None and bool(self.adapter.fixed.get("tied"))

    # -- calls -----------------------------------------------------------------------------------------

    def call(self, conv: Conventions, example: Example) -> Tensor | Exception:
        """The candidate's output on ``example`` called in ``conv`` (canonical layout), or what it raised. With
        ``example.repeat`` (a kernel of whole blocks) the candidate gets every position repeated, and the output
        kept is the last query of each block: what the example's own query computes (see :class:`Example`)."""
        self.probes += 1
        self.adapter.conventions = conv
        try:
            out = self.adapter.call(example.inputs(), example.mask(), example.is_causal, example.torch_dtype)
            r = example.repeat
            if r > 1 and isinstance(out, Tensor) and out.ndim == 4 and out.shape[-2] == example.t * r:
                out = out[..., r - 1::r, :]
        except CandidateRaised as raised:
            cause = raised.__cause__
            return cause if isinstance(cause, Exception) else raised
        except CheckFailure as failure:  # not a tensor
            return failure
        finally:
            self.adapter.conventions = self.conv
        return out

    def reference(self, conv: Conventions, example: Example, keep: Tensor | None = None,
                  is_causal: bool | None = None) -> Tensor:
        self.adapter.conventions = conv
        example = _plain(example)  # the positions themselves: what the kept rows of a repeated call compute
        try:
            return self.adapter.reference(example.inputs(), example.mask() if keep is None else keep,
                                          example.is_causal if is_causal is None else is_causal, torch.float64)
        finally:
            self.adapter.conventions = self.conv

    def matches(self, out: Tensor | Exception, ref: Tensor) -> bool:
        if not isinstance(out, Tensor) or tuple(out.shape) != tuple(ref.shape):
            return False
        finite = ref[torch.isfinite(ref)]
        size = float(finite.abs().max()) if finite.numel() else 1.0
        return error(out, ref) <= _RTOL[self.dtype] * max(size, 1.0)

    def close(self, a: float, b: float) -> bool:
        """Two logit scales estimated in the probes' dtype agree."""
        return _close(a, b, _SCALE_RTOL[self.dtype])

    def inputs(self, example: Example) -> tuple[Tensor, Tensor, Tensor]:
        """``example``'s inputs as the candidate receives them: rounded to the probes' dtype (in float64)."""
        q, k, v = _plain(example).inputs()
        dtype = example.torch_dtype
        return q.to(dtype).double(), k.to(dtype).double(), v.to(dtype).double()

    def repro(self, conv: Conventions, example: Example, what: str) -> str:
        self.adapter.conventions = conv
        try:
            return self.adapter.repro(example, what)
        finally:
            self.adapter.conventions = self.conv

    # -- record ----------------------------------------------------------------------------------------

    def decide(self, name: str, value: Any, seen: str, conv: Conventions | None = None,
               example: Example | None = None) -> None:
        self.evidence[name] = Evidence(name, value, seen, example, conv,
                                       "" if example is None or conv is None
                                       else self.repro(conv, example, f"inference of {name}"))
        if conv is not None and name in {f.name for f in dataclasses.fields(Conventions)}:
            changes: dict[str, Any] = {name: value}
            self.conv = dataclasses.replace(self.conv, **changes)

    def find(self, name: str, message: str, conv: Conventions | None = None, example: Example | None = None,
             declarable: tuple[str, Any] | None = None) -> None:
        self.findings.append(Finding(name, message, example,
                                     "" if example is None or conv is None
                                     else self.repro(conv, example, f"inference of {name}"), declarable))


def _plain(example: Example) -> Example:
    """``example`` without its repeats (see :meth:`_Prober.call`)."""
    return example if example.repeat == 1 else dataclasses.replace(example, repeat=1)


def _describe(out: Tensor | Exception) -> str:
    if isinstance(out, Exception):
        first = str(out).splitlines()[0] if str(out) else ""
        return f"raised {type(out).__name__}: {first}"
    return f"returned a {tuple(out.shape)} tensor that differs"


# ----------------------------------------------------------------------------------------------------
# The decisions
# ----------------------------------------------------------------------------------------------------


def _signature(p: _Prober, candidate: Any) -> None:
    """``supports_mask``/``supports_causal``: False only when the signature lacks the argument."""
    try:
        params = inspect.signature(candidate).parameters
    except (TypeError, ValueError):
        p.decide("supports_mask", True, "no signature to read: assumed to take attn_mask")
        p.decide("supports_causal", True, "no signature to read: assumed to take is_causal")
        return
    var_kw = any(x.kind is inspect.Parameter.VAR_KEYWORD for x in params.values())
    p.gqa_keyword = "enable_gqa" in params or var_kw
    for name, arg in (("supports_mask", "attn_mask"), ("supports_causal", "is_causal")):
        has = arg in params or var_kw
        changes: dict[str, Any] = {name: has}
        p.conv = dataclasses.replace(p.conv, **changes)
        p.decide(name, has, f"the signature {'takes' if has else 'has no'} {arg}"
                 + (" (**kwargs)" if has and arg not in params else ""))


def _weights(v: Tensor, out: Tensor) -> Tensor:
    """The attention weights ``w`` (``s``) with ``out = w @ v`` (``v``: ``s x dv``, ``s <= dv``): solved when ``v``
    is square, least squares otherwise."""
    if v.shape[0] == v.shape[1]:
        solved: Tensor = torch.linalg.solve(v.T, out)
        return solved
    solution: Tensor = torch.linalg.lstsq(v.T, out[:, None]).solution
    return solution[:, 0]


def _estimate_scale(p: _Prober, d: int, h: int, s: int = 2) -> tuple[float | None, Example, Tensor | Exception]:
    """The logit scale from the last query against ``s`` keys (``t = s``: the last query sees every key under any
    causal rule; ``dv = s``, or ``dv = d >= s`` for a candidate that needs dv = d: its ``s`` attention weights
    ``w`` are recovered from ``out = w @ v``), fitted as ``log w_j = scale * (q . k_j) + c`` on the inputs as the
    candidate receives them (rounded to the probes' dtype); None when the output is no softmax-weighted mean of
    the values."""
    dv = d if p.conv.equal_head_sizes or p.dtype in ("float16", "bfloat16") or p.conv.head_size_multiple > 1 else s
    rtol = _SCALE_RTOL[p.dtype]
    for offset in range(40):  # logits about 1 apart (amplitude d^-1/4), well-conditioned values
        example = dataclasses.replace(p.example(t=s, s=s, h=h, d=d, dv=dv, offset=offset), amplitude=d ** -0.25)
        q, k, v = p.inputs(example)
        logits = k[0, 0] @ q[0, 0, -1]
        gaps = (logits[:, None] - logits[None, :]).abs() + 10 * torch.eye(s, dtype=torch.float64)
        if float(gaps.min()) > 0.2 and float(logits.max() - logits.min()) < 4 and float(
                torch.linalg.cond(v[0, 0])) < 50:
            break
    out = p.call(p.conv, example)
    if not isinstance(out, Tensor) or out.shape != (1, h, s, dv) or not bool(torch.isfinite(out).all()):
        return None, example, out
    q, k, v = p.inputs(example)
    logits = k[0, 0] @ q[0, 0, -1]
    weights = _weights(v[0, 0], out[0, 0, -1].double())
    if not bool((weights > 1e-9).all()) or abs(float(weights.sum()) - 1.0) > rtol:
        return None, example, out
    logw, centred = weights.log(), logits - logits.mean()
    slope = float((centred * (logw - logw.mean())).sum() / (centred * centred).sum())
    fit = slope * centred + logw.mean()
    if float((logw - fit).abs().max()) > rtol * max(1.0, abs(slope) * float(centred.abs().max())):
        return None, example, out  # weighted, but no softmax of one scale times the logits
    return slope, example, out


def _close(a: float, b: float, rtol: float = 1e-3) -> bool:
    return abs(a - b) <= rtol * max(abs(a), abs(b))


def _snapped(value: float, rtol: float) -> float:
    """A constant scale estimated in half precision, snapped to the nearest ``n``, ``1/n`` or ``1/sqrt(n)``
    (``n`` = 1..1024) within ``rtol``; else rounded to four digits."""
    nice = [m for n in range(1, 1025) for m in (float(n), 1.0 / n, 1.0 / math.sqrt(n))]
    best = min(nice, key=lambda m: abs(m - value))
    return best if _close(best, value, rtol) else float(f"{value:.4g}")


#: the probes' (head size, key length): two head sizes at one length, two lengths at one head size; with dv = d
#: (a candidate that needs it) at lengths up to d; in half precision at head sizes that half kernels take
#: (multiples of 8), where the weights of 4 keys are recovered from 16 or 32 rounded values
_SCALE_PROBES = ((2, 4), (8, 4), (2, 7))
_SCALE_PROBES_DV_D = ((4, 4), (8, 4), (4, 3))
_SCALE_PROBES_HALF = ((16, 4), (32, 4), (16, 3))


#: the head sizes a candidate that refuses d = 4 is probed at, smallest first: the least that answers is the multiple
#: every drawn head size keeps (half-precision kernels: 8; some Triton kernels: 16 or more)
_MULTIPLE_PROBES = (8, 16, 32, 64)


#: the blocks a candidate that refuses the plainest call at every head size is probed at, smallest first: the least
#: that answers (every position repeated that many times) is the multiple every drawn length keeps (a kernel that
#: tiles its sequences without masking a partial tile: blocks of 16 to 128)
_BLOCK_PROBES = (8, 16, 32, 64, 128)


def _accepted(p: _Prober) -> bool:
    """The probes' dtype, ``equal_head_sizes``, ``head_size_multiple`` and ``length_multiple``: the plainest call
    (h=1, t=3, s=4, d=4, dv=3, in either layout) in float64, else float32, float16 and bfloat16, each with dv = d
    when dv = 3 is refused. The first dtype that gives a tensor of the call's shape decides both. Where every dtype
    refuses d = 4, the same at d = 8, 16, 32, 64 (dv = 2d, else dv = d): the least that answers is the multiple
    every head size drawn keeps, and a refused 2d keeps the head size at d. Where every head size is refused, the
    same with every position repeated 8, 16, 32, 64 and 128 times (t = 3 blocks, s = 4 blocks): the least block that
    answers is the multiple every drawn length keeps. Each refusal is named in the evidence. False (a finding) when
    every block refuses every head size in every dtype."""
    refusals: list[str] = []
    declared = p.conv.length_multiple
    for block in (declared, *(m for m in _BLOCK_PROBES if m > declared)):
        p.conv = dataclasses.replace(p.conv, length_multiple=block)
        tried: list[str] = []
        if _accepted_sizes(p, tried):
            if block != declared:
                smaller = ", ".join(str(m) for m in _BLOCK_PROBES if declared < m < block)
                too = f", in blocks of {smaller} too" if smaller else ""
                d = p.conv.head_size(4)  # the refusal quoted: the answering dtype's, at the answering head size
                prefix = f"{p.dtype} with {'' if d == 4 else f'd={d}, '}dv="
                quoted = [r for r in refusals if r.startswith(prefix)] or refusals
                p.decide("length_multiple", block, f"h=1, t=3, s=4: every head size is refused in every dtype "
                         f"({quoted[-1]}){too}; "
                         f"t={3 * block}, s={4 * block} (each position repeated {block} times) answers (only "
                         f"multiples of {block} are drawn; the probes below count positions of {block})", p.conv,
                         p.example(t=3, s=4, h=1))
            return True
        refusals += tried if block == declared else tried[-1:]
    p.dtype = "float64"
    p.conv = dataclasses.replace(p.conv, length_multiple=declared)
    first = p.conv.head_size(4)
    p.find("reference", f"the plainest call (h=1, t=3, s=4, d={first}, dv=3 or 4, and d = dv up to 64; lengths in "
           f"blocks up to {_BLOCK_PROBES[-1]}) is refused in every dtype: {'; '.join(refusals)}")
    return False


def _accepted_sizes(p: _Prober, refusals: list[str]) -> bool:
    """:func:`_accepted` at one block: the head sizes, least first."""
    last: dict[int, str] = {}  # each head size's refusal in the last dtype probed
    declared, first = p.conv.head_size_multiple, p.conv.head_size(4)  # d = 4, or a declared multiple's least
    for d in (first, *(m for m in _MULTIPLE_PROBES if m > first)):
        if d != first:
            p.conv = dataclasses.replace(p.conv, head_size_multiple=d)
        if _accepted_at(p, d, refusals):
            if d != first:
                p.decide("head_size_multiple", d, f"h=1, t=3, s=4: every smaller head size is refused in every "
                         f"dtype ({'; '.join(f'd={n}: {why}' for n, why in last.items())}); d={d} answers (only "
                         f"multiples of {d} are drawn)", p.conv, p.example(t=3, s=4, h=1, d=d))
                _widest(p, d)
            return True
        last[d] = refusals[-1]
    p.conv = dataclasses.replace(p.conv, head_size_multiple=declared)
    return False


def _accepted_at(p: _Prober, d: int, refusals: list[str]) -> bool:
    """The plainest call at head size ``d`` in each dtype, with dv != d (3, or 2d for a multiple), else dv = d: True
    (and the dtype and ``equal_head_sizes`` decided) at the first that answers with a tensor of the call's shape."""
    unequal, other = "", []  # the last dv != d refusal; each dtype's refusal with dv != d
    for dtype in _PROBE_DTYPES:
        p.dtype = dtype
        for dv in ((3, 4) if d == 4 else (2 * d, d)):
            conv = dataclasses.replace(p.conv, equal_head_sizes=dv == d)
            example = dataclasses.replace(p.example(t=3, s=4, h=1, d=d, dv=dv), dtype=dtype)
            outs = []
            for layout in ("bhtd", "bthd"):
                out = p.call(dataclasses.replace(conv, layout=layout), example)
                outs.append(out)
                if isinstance(out, Tensor) and tuple(out.shape) == (1, 1, 3, dv):
                    break
            else:
                refusals.append(f"{dtype} with {'' if d == 4 else f'd={d}, '}dv={dv} {_describe(outs[0])}")
                if dv != d:
                    unequal = _describe(outs[0])
                    other.append(refusals[-1])
                continue
            if dtype != "float64":
                p.decide("probe_dtype", dtype, f"probed in {dtype}: {'; '.join(other)}")
            if dv == d:
                p.decide("equal_head_sizes", True, f"h=1, t=3, s=4, d={d}: dv={2 * d if d > 4 else 3} {unequal}; "
                         f"dv={d} answers (only dv = d is drawn)", conv, example)
            return True
    return False


def _max_length(p: _Prober, longest: int) -> None:
    """``max_length``: the plainest call (h=1, t = s) at the longest length the audit will draw; where the candidate
    raises there, the longest length that answers, bisected between 4 (the plainest call's) and it (in whole blocks
    where ``length_multiple`` is more than 1). Only a raise is a refusal: a wrong output at a long length is for the
    checks to find."""
    if p.conv.max_length is not None:  # declared
        return
    declared = p.conv.lengths != DEFAULT_CONVENTIONS.lengths
    m = p.conv.length_multiple  # lengths in whole blocks: probed as repeats of n positions (see _Prober.call)
    top = -(-(min(longest, p.conv.lengths[1]) if declared else longest) // m)
    if top <= 4:
        return

    def square(n: int) -> Example:
        return p.example(t=n, s=n, h=1, offset=11)

    def refusal(n: int) -> Exception | None:
        out = p.call(p.conv, square(n))
        return out if isinstance(out, Exception) and not isinstance(out, CheckFailure) else None

    refused = refusal(top)
    if refused is None:
        return
    low, high = 4, top  # low answers (the plainest call), high raises
    while high - low > 1:
        mid = (low + high) // 2
        if refusal(mid) is None:
            low = mid
        else:
            high = mid
    p.decide("max_length", low * m, f"h=1, t=s={top * m} (the longest the audit draws) {_describe(refused)}; "
             f"t=s={low * m} answers and {high * m} raises (lengths up to {low * m} are drawn)", p.conv, square(low))


def _widest(p: _Prober, d: int) -> None:
    """``head_sizes`` kept at ``(d, d)`` when the candidate that takes head size ``d`` refuses ``2 d``."""
    wide = p.example(t=3, s=4, h=1, d=2 * d)
    out = p.call(p.conv, wide)
    if not (isinstance(out, Tensor) and tuple(out.shape) == (1, 1, 3, wide.dv)):
        p.decide("head_sizes", (d, d), f"h=1, t=3, s=4, d={2 * d} {_describe(out)}; d={d} answers (only d={d} is "
                 f"drawn)", p.conv, wide)


def _autograd(p: _Prober) -> None:
    """``supports_autograd``: the backward of the plainest accepted call (h=1, t=3, s=4, d=4). A candidate whose
    backward is refused (NotImplementedError, or an error saying it is not implemented or not supported:
    FlexAttention on the CPU), or whose output carries no gradient (an inference-only kernel), is
    audited without the gradient check, which the report lists under "not tested" with the refusal. Not probed when
    the user declared it."""
    if not p.conv.supports_autograd:
        return
    example = p.example(t=3, s=4, h=1, d=4)
    leaves = [x.to(example.torch_dtype).detach().requires_grad_(True) for x in example.inputs()]
    p.probes += 1
    p.adapter.conventions = p.conv
    try:
        out = p.adapter.call((leaves[0], leaves[1], leaves[2]), None, False, example.torch_dtype)
        if not out.requires_grad:
            refusal = "output carries no gradient (requires_grad=False)"
        else:
            with candidate_code():
                torch.autograd.backward([out.double().sum()])
            return
    except CandidateRaised as raised:
        cause = raised.__cause__ if isinstance(raised.__cause__, Exception) else raised
        text = str(cause).lower()
        if not (isinstance(cause, NotImplementedError) or "not implemented" in text or "not support" in text):
            return  # a backward that breaks is no refusal: the gradient check fails with it
        refusal = _describe(cause)
    except CheckFailure:
        return  # not a tensor: the checks report that
    finally:
        p.adapter.conventions = p.conv
    what = refusal if refusal.startswith("output") else f"backward {refusal}"
    p.decide("supports_autograd", False, f"h=1, t=3, s=4, d=4: its {what} (gradients are not tested)", p.conv,
             example)


def _scale(p: _Prober) -> bool:
    """``scale``: ``1/sqrt(d)`` at (d, s) = (2, 4), (8, 4) and (2, 7), or one constant (the last query against
    every key, in the first layout where that call gives a weighted mean). A scale that depends on the key
    length (``1/sqrt(s)``) is a finding named so, and stops inference. False when nothing further can be
    inferred."""
    estimates: dict[tuple[int, int], tuple[float, Example]] = {}
    failure: tuple[str, Example, Tensor | Exception] | None = None
    probes: tuple[tuple[int, int], ...] = (_SCALE_PROBES_HALF if p.dtype in ("float16", "bfloat16")
                                           else _SCALE_PROBES_DV_D if p.conv.equal_head_sizes else _SCALE_PROBES)
    if p.conv.head_sizes[0] == p.conv.head_sizes[1] >= p.conv.head_size_multiple > 1:  # the one head size it takes
        d = p.conv.head_sizes[0]
        probes = ((d, 4), (d, 4), (d, 3))
    elif p.conv.head_size_multiple > 1:  # two head sizes it takes, the smaller at two lengths
        low = p.conv.head_size(16 if p.dtype in ("float16", "bfloat16") else 8)
        probes = ((low, 4), (2 * low, 4), (low, 3))
    if p.conv.length_multiple > 1:  # whole blocks: 7 would be 7 blocks, past many such kernels' longest
        probes = tuple((d, 3 if s > 4 else s) for d, s in probes)
    for layout in ("bhtd", "bthd"):
        p.conv = dataclasses.replace(p.conv, layout=layout)
        estimates = {}
        for d, s in dict.fromkeys(probes):  # each once (a candidate of one head size repeats one)
            value, example, out = _estimate_scale(p, d, 1, s)
            if value is None:
                failure = failure or (layout, example, out)
                break
            estimates[d, s] = (value, example)
        if len(estimates) == len(set(probes)):
            break
    else:
        assert failure is not None
        layout, example, out = failure
        p.conv = dataclasses.replace(p.conv, layout="bhtd")
        if isinstance(out, Tensor) and out.shape == (1, 1, example.s, example.dv) and bool(out.isfinite().all()):
            weights = _weights(p.inputs(example)[2][0, 0], out[0, 0, -1].double())
            p.find("reference", f"the last query against s={example.s} keys (d={example.d}, no mask, no is_causal) "
                   f"is no softmax-weighted mean of the values: its weights solve to ["
                   + ", ".join(f"{w:.3g}" for w in weights.tolist()) + "]: not a convention, a bug "
                   "(the checks show where the output differs)", p.conv, example)
        else:
            p.find("scale", f"queries against {example.s} keys (h=1, {layout}) {_describe(out)}", p.conv, example)
        return False
    (da, sa), (db, _), (_, sc) = probes
    (s2, _), (s8, e8), (s27, e27) = estimates[da, sa], estimates[db, sa], estimates[da, sc]
    close = p.close
    if close(s2, 1 / math.sqrt(da)) and close(s8, 1 / math.sqrt(db)) and close(s27, 1 / math.sqrt(da)):
        sizes = f"d={da}, the one head size it takes," if da == db else f"d={da} and {s8:.4g} at d={db}"
        p.decide("scale", None, f"logit scale {s2:.4g} at {sizes} (s={sa}), {s27:.4g} at s={sc} (d={da}): "
                 f"1/sqrt(d)", p.conv, e8)
    elif not close(s2, s27):
        named = (": 1/sqrt(s), the key length where the paper has the head size d"
                 if close(s2, 1 / math.sqrt(sa)) and close(s27, 1 / math.sqrt(sc)) else "")
        also = "" if close(s2, s8) else f"; and on the head size: {s2:.4g} at d={da}, {s8:.4g} at d={db} (s={sa})"
        p.find("scale", f"the scale depends on the key length: logit scale {s2:.4g} at s={sa} and {s27:.4g} at "
               f"s={sc} (d={da}){named}{also}", p.conv, e27)
        p.conv = dataclasses.replace(p.conv, scale=None)
        return False  # every later probe has its own key length: they would only blame other fields
    elif close(s2, s8):
        value = round(s8, 6) if p.dtype in ("float64", "float32") else _snapped(s8, _SCALE_RTOL[p.dtype])
        p.decide("scale", value, f"logit scale {s8:.6g} at d={da} and d={db}, s={sa} and s={sc}: a constant, not "
                 f"1/sqrt(d)", p.conv, e8)
    else:
        p.find("scale", f"logit scale {s2:.4g} at d={da} and {s8:.4g} at d={db} (s={sa}): neither 1/sqrt(d) nor a "
               f"constant", p.conv, e8)
        p.conv = dataclasses.replace(p.conv, scale=None)
    return True


def _any_reference(p: _Prober, conv: Conventions, example: Example, out: Tensor | Exception) -> bool:
    """``out`` is the reference's, plain or always causal (either alignment: decided later)."""
    trials = [conv] + [dataclasses.replace(conv, always_causal=True, causal_alignment=a)
                       for a in ("bottom-right", "top-left")]
    return any(p.matches(out, p.reference(trial, example)) for trial in trials)


def _layout(p: _Prober) -> bool:
    """``layout``: the output matches the reference in exactly one of bhtd/bthd (h=2, t=3, s=4)."""
    example = p.example(t=3, s=4, h=2, d=4, dv=3)
    outcomes = {}
    for layout in ("bhtd", "bthd"):
        conv = dataclasses.replace(p.conv, layout=layout)
        outcomes[layout] = out = p.call(conv, example)
        if _any_reference(p, conv, example, out):
            p.decide("layout", layout, f"h=2, t=3, s=4 matches the reference in {layout}", conv, example)
            return True
    # one head matches, two do not: the head count changes the result (a scale that depends on it)
    for layout in ("bhtd", "bthd"):
        conv = dataclasses.replace(p.conv, layout=layout)  # type: ignore[arg-type]
        single = p.example(t=3, s=4, h=1, d=4, dv=3)
        if _any_reference(p, conv, single, p.call(conv, single)):
            p.conv = conv
            scale, _, _ = _estimate_scale(p, 4, 2, 4)
            p.decide("layout", layout, f"h=1, t=3, s=4 matches the reference in {layout}", conv, single)
            expected = 1 / math.sqrt(4) if p.conv.scale is None else p.conv.scale
            seen = f"{scale:.4g}" if scale is not None else "no weighted mean"
            p.find("scale", f"the result depends on the head count: h=1 matches the reference, h=2 does not "
                   f"(logit scale {expected:.4g} at h=1, {seen} at h=2, d=4)", conv, example)
            return False
    p.find("layout", f"h=2, t=3, s=4 matches the reference in neither bhtd ({_describe(outcomes['bhtd'])}) nor "
           f"bthd ({_describe(outcomes['bthd'])})", p.conv, example)
    return False


def _gqa(p: _Prober) -> None:
    """``supports_gqa``, ``grouping`` and ``enable_gqa``: h=4 query heads on g=2 key/value heads, told so with
    ``enable_gqa=True`` only when the plain call raises (torch's SDPA)."""
    example = p.example(t=2, s=3, h=4, g=2, d=3)
    refused: Exception | None = None
    for flag in (False, True):
        for grouping in ("g r", "r g"):
            conv = dataclasses.replace(p.conv, supports_gqa=True, grouping=grouping, enable_gqa=flag)
            out = p.call(conv, example)
            if isinstance(out, Exception):
                if flag or not p.gqa_keyword:  # (enable_gqa=True does not help either) the first refusal decides
                    p.decide("supports_gqa", False, f"h=4, g=2 {_describe(refused or out)}", p.conv, example)
                    return
                refused = out
                break
            if _any_reference(p, conv, example, out):
                said = "" if refused is None else _describe(refused)
                how = f" with enable_gqa=True (without it: {said})" if flag else ""
                p.decide("supports_gqa", True, f"h=4 query heads on g=2 key/value heads{how}", conv, example)
                if flag:
                    p.decide("enable_gqa", True, f"h=4, g=2 {said} without enable_gqa=True, and "
                             f"matches the reference with it", conv, example)
                which = "i // 2" if grouping == "g r" else "i % 2"
                p.decide("grouping", grouping, f"head i uses key/value head {which} (h=4, g=2)", conv, example)
                return
        if refused is None:
            break
    p.decide("supports_gqa", False, "h=4, g=2 accepted but matches no grouping (see findings)")
    p.find("grouping", "h=4 query heads on g=2 key/value heads are accepted but match neither grouping "
           "('g r': head i uses i // 2; 'r g': i % 2)", p.conv, example)


def _causal(p: _Prober) -> None:
    """``always_causal``, what ``is_causal=True`` does at t = s, ``causal_alignment`` (t=2, s=4) and the decode
    rule (t=1, s=3)."""
    conv = p.conv
    n = p.square
    square = p.example(t=n, s=n, offset=1)
    plain = p.call(conv, square)
    causal_conv = dataclasses.replace(conv, always_causal=True)
    if not p.matches(plain, p.reference(conv, square)) and p.matches(plain, p.reference(causal_conv, square)):
        p.decide("always_causal", True, f"t=s={n} without is_causal: query i sees keys j <= i only", causal_conv,
                 square)
        conv = p.conv
    elif not p.matches(plain, p.reference(conv, square)):  # not causality's: no causal finding to blame it on
        p.find("reference", f"t=s={n} without mask or is_causal {_describe(plain)} from the reference, plain or "
               f"always causal: not a convention, a bug (the checks show where the output differs)", conv, square)
        return
    else:
        p.decide("always_causal", False, f"t=s={n} without is_causal: every query sees every key", conv, square)
    if not conv.supports_causal and not conv.always_causal:
        return
    flagged = conv.supports_causal and not conv.always_causal
    if flagged:
        example = dataclasses.replace(square, is_causal=True)
        out = p.call(conv, example)
        if not p.matches(out, p.reference(conv, example)):
            if p.matches(out, p.reference(conv, example, is_causal=False)):
                p.find("supports_causal", f"is_causal=True is accepted and ignored (t=s={n}: every query sees every "
                       f"key)", conv, example)
            else:
                p.find("causal_alignment", f"is_causal=True at t=s={n} matches neither top-left nor bottom-right "
                       f"(both: query i sees keys j <= i; {_describe(out)})", conv, example)
            return
    if p.tied:
        p.decide("causal_alignment", conv.causal_alignment, "one input (t = s): the alignment is not observable, "
                 "kept as declared")
        return
    wide = p.example(t=2, s=4, is_causal=flagged, offset=2)
    out = p.call(conv, wide)
    seen = "is_causal=True" if flagged else "always causal"
    for alignment in ("bottom-right", "top-left"):
        trial = dataclasses.replace(conv, causal_alignment=alignment, decode_sees_all=False)
        if p.matches(out, p.reference(trial, wide)):
            rule = "j <= i + s - t" if alignment == "bottom-right" else "j <= i"
            p.decide("causal_alignment", alignment, f"{seen}, t=2, s=4: query i sees keys {rule}", trial, wide)
            break
    else:
        p.find("causal_alignment", f"{seen} with t=2 < s=4 matches neither top-left (query i sees j <= i) nor "
               f"bottom-right (j <= i + s - t) ({_describe(out)})", conv, wide)
        return
    conv = p.conv
    one = p.example(t=1, s=3, is_causal=flagged, offset=3)
    out = p.call(conv, one)
    sees_all = dataclasses.replace(conv, decode_sees_all=True)
    if p.matches(out, p.reference(conv, one)):
        p.decide("decode_sees_all", False, f"{seen}, one query against 3 keys sees "
                 + ("every key, as bottom-right says" if conv.causal_alignment == "bottom-right"
                    else "key 0 only, as top-left says"), conv, one)
    elif p.matches(out, p.reference(sees_all, one)):
        p.decide("decode_sees_all", True, f"{seen}, one query against 3 keys sees every key (top-left otherwise)",
                 sees_all, one)
    else:
        p.find("decode_sees_all", f"{seen}, one query against 3 keys sees neither every key nor key 0 only "
               f"({_describe(out)})", conv, one)


# a keep-mask whose complement also leaves every row a key (so polarities are told apart)
_MASK = torch.tensor([[True, False, True, False], [False, True, True, False], [True, True, False, True],
                      [False, True, False, True]])
# a second head's keep-mask, different in every row; both leave every row a key under either causal alignment
_MASK2 = torch.tensor([[True, True, False, True], [True, False, True, True], [False, True, True, False],
                       [True, False, True, True]])


def _mask(p: _Prober) -> bool:
    """``mask_kind`` and ``mask_polarity`` (a (1, 1, t, s) mask, t=3, s=4: a function is probed with a boolean
    and a float mask, see :func:`_mask_kinds`), then per-head masks."""
    conv = p.conv
    t, s = (4, 4) if p.tied else (3, 4)
    keep = _MASK[:t, :s][None, None]
    example = p.example(t=t, s=s, keep=keep, offset=4)
    if p.adapter.fixed is None:
        if not _mask_kinds(p, example):
            return False
    else:  # a module's spec converts masks itself
        out = p.call(conv, example)
        if not p.matches(out, p.reference(conv, example)):
            _unmasked(p, conv, example, [out], f"the spec's {conv.mask_kind} mask")
            return False
    conv = p.conv
    if p.adapter.fixed is not None and p.adapter.fixed["h"] < 2:
        return True
    per_head = torch.stack([_MASK[:t, :s], _MASK2[:t, :s]])[None]
    heads = 2 if p.adapter.fixed is None else p.adapter.fixed["h"]
    per_head = per_head.repeat(1, (heads + 1) // 2, 1, 1)[:, :heads]
    example = p.example(t=t, s=s, h=heads, keep=per_head, offset=5)
    out = p.call(conv, example)
    if isinstance(out, Exception):
        p.decide("per_head_masks", False, f"a per-head mask (1, {heads}, {t}, {s}) {_describe(out)}", conv, example)
    elif p.matches(out, p.reference(conv, example)):
        p.decide("per_head_masks", True, f"a per-head mask (1, {heads}, {t}, {s}) is applied head by head", conv,
                 example)
    else:
        p.decide("per_head_masks", False, "see findings")
        p.find("per_head_masks", f"a per-head mask (1, {heads}, {t}, {s}) is accepted but not applied head by head",
               conv, example)
    return True


def _added_as_numbers(p: _Prober, conv: Conventions, example: Example, out: Tensor | Exception) -> bool:
    """``out`` is the unmasked attention with the boolean mask added to its scaled logits as +1/+0 (the silent
    bug of an "eager" path given a boolean mask where it expects a float one)."""
    if not isinstance(out, Tensor) or example.keep is None or p.adapter.fixed is not None:
        return False  # a module's inputs are tokens, not q, k and v: its spec passes the mask itself
    plain = _plain(example)
    q, k, v = plain.inputs()
    ref = reference_attention(q, k, v, None, conventions=dataclasses.replace(conv, always_causal=False),
                              bias=plain.mask().to(torch.float64))  # type: ignore[union-attr]
    return p.matches(out, ref)


def _unmasked(p: _Prober, conv: Conventions, example: Example, outs: list[Tensor | Exception], what: str) -> None:
    """The finding of a mask that matches no convention: ignored, added as numbers, or neither."""
    keep = _plain(example).mask()
    assert keep is not None
    if any(p.matches(out, p.reference(conv, example, keep=torch.ones_like(keep))) for out in outs):
        p.find("supports_mask", "attn_mask is accepted and ignored (the output is the unmasked one, whatever "
               "the mask)", conv, example)
    elif any(_added_as_numbers(p, conv, example, out) for out in outs):
        p.find("mask_kind", f"{what} is added to the logits as +1/+0 (True -> +1): it masks nothing (a boolean mask "
               f"given to a path that adds float masks)", conv, example)
    else:
        p.find("mask_polarity", "attn_mask (1, 1, t, s) masks under no convention: neither boolean True = may "
               "attend, boolean True = masked out, nor additive 0/-inf (" + "; ".join(map(_describe, outs))
               + ")", conv, example)


def _mask_kinds(p: _Prober, example: Example) -> bool:
    """A function's ``mask_kind`` and ``mask_polarity``: one boolean mask and one float 0/-inf mask, each must
    match a documented convention when accepted, and both must agree: a boolean mask added as +1/+0 while the
    float mask works is a finding (not "additive"), and so is a boolean path flipped against the float path
    (True = masked out beside 0 = may attend: a finding unless ``known`` says ``mask_polarity="drop"``,
    nn.MultiheadAttention's)."""
    conv = p.conv
    trials = {(kind, polarity): dataclasses.replace(conv, mask_kind=kind, mask_polarity=polarity)  # type: ignore[arg-type]
              for kind, polarity in (("bool", "keep"), ("bool", "drop"), ("additive", "keep"))}
    outs = {key: p.call(trial, example) for key, trial in trials.items()}
    ok = {key: p.matches(outs[key], p.reference(trial, example)) for key, trial in trials.items()}
    additive, shape = ok["additive", "keep"], tuple(_plain(example).mask().shape)  # type: ignore[union-attr]
    both = " (a float 0/-inf mask is applied too)" if additive else ""
    if ok["bool", "keep"] or ok["bool", "drop"]:
        polarity = "keep" if ok["bool", "keep"] else "drop"
        trial = trials["bool", polarity]
        p.decide("mask_kind", "bool", f"a boolean mask is applied{both}", trial, example)
        what = "True = may attend" if polarity == "keep" else "True = masked out"
        p.decide("mask_polarity", polarity, f"a boolean mask {shape} with {what}{both}", trial, example)
        if polarity == "drop" and additive:
            p.find("mask_polarity", f"the boolean path is flipped against the float one: a boolean mask {shape} "
                   f"applies True = masked out, a float mask 0 = may attend (if True = masked out is intended, as in "
                   f"nn.MultiheadAttention, declare known={{'mask_polarity': 'drop'}} / --expect "
                   f"mask_polarity=drop)", trial, example, declarable=("mask_polarity", "drop"))
        elif not additive and not isinstance(outs["additive", "keep"], Exception):
            p.find("mask_kind", f"a float 0/-inf mask {shape} is accepted but not added to the logits "
                   f"({_describe(outs['additive', 'keep'])}); the boolean mask is applied with {what}",
                   trials["additive", "keep"], example)
        return True
    if additive:
        p.decide("mask_kind", "additive", "a 0/-inf float mask is applied", trials["additive", "keep"], example)
        if not isinstance(outs["bool", "keep"], Exception):  # a boolean mask accepted, and wrong
            bool_conv = trials["bool", "keep"]
            if _added_as_numbers(p, bool_conv, example, outs["bool", "keep"]):
                p.find("mask_kind", f"a boolean mask {shape} is added to the logits as +1/+0 (True -> +1), "
                       f"masking nothing, while a float 0/-inf mask is applied: the silent bug of a path that adds "
                       f"masks given a boolean one", bool_conv, example)
            else:
                p.find("mask_polarity", f"a boolean mask {shape} is accepted but masks under no convention "
                       f"({_describe(outs['bool', 'keep'])}), while a float 0/-inf mask is applied",
                       bool_conv, example)
        return True
    _unmasked(p, conv, example, list(outs.values()), "a boolean mask")
    return False


def _fully_masked(p: _Prober, masks: bool) -> None:
    """``fully_masked``: a query row without any allowed key gives one of zeros, NaN or the mean of the values,
    the same on a second call (else a finding); with dv = d and dv != d, in float64 and float32 (different
    documented rows there: ``"any"``, with the witnesses)."""
    conv = p.conv
    examples = []
    for offset, dv in ((6, 4), (7, 3)):  # dv = d and dv != d: kernels differ there
        if masks:
            t, s = (4, 4) if p.tied else (3, 4)
            keep = _MASK[:t, :s][None, None].clone()
            keep[..., 0, :] = False
            examples.append(p.example(t=t, s=s, d=4, dv=dv, keep=keep, offset=offset))
        elif (conv.causal_alignment == "bottom-right" and not p.tied and (conv.supports_causal or conv.always_causal)
              and not any(f.field in ("supports_causal", "causal_alignment") for f in p.findings)):
            examples.append(p.example(t=3, s=2, d=4, dv=dv, is_causal=conv.supports_causal and not conv.always_causal,
                                      offset=offset))
    if not examples:
        p.decide("fully_masked", conv.fully_masked, "no input this candidate takes leaves a query row without keys")
        return
    if conv.equal_head_sizes:  # dv = d only
        examples = examples[:1]
    # float64 and float32 too: a mask fill of finfo(float64).min becomes -inf in a float32 softmax (NaN rows)
    if p.dtype == "float64":
        examples += [dataclasses.replace(example, dtype="float32") for example in examples]
    kinds = []
    for example in examples:
        out = p.call(conv, example)
        again = p.call(conv, example)
        if isinstance(out, Tensor) and isinstance(again, Tensor) and not torch.equal(out.isnan(), again.isnan()):
            p.find("fully_masked", "a fully masked row gives NaN on one call and not on the next (same input)",
                   conv, example)
            return
        for kind in ("zero", "nan", "uniform"):
            trial = dataclasses.replace(conv, fully_masked=kind)
            if p.matches(out, p.reference(trial, example)):
                kinds.append(kind)
                break
        else:
            p.find("fully_masked", f"a query row without any allowed key gives neither zeros, NaN nor the mean of the "
                   f"values ({_describe(out) if isinstance(out, Exception) else 'row 0 = ' + _row(out)})", conv,
                   example)
            p.conv = dataclasses.replace(p.conv, fully_masked="zero")
            return
    how = "mask row 0 all False" if masks else "is_causal, t=3 > s=2 (bottom-right: row 0 sees no key)"
    if len(set(kinds)) > 1:
        seen = "; ".join(f"{_ROW_NAMES[kind]} with dv {'=' if e.dv == e.d else '!='} d in {e.dtype}"
                         for kind, e in zip(kinds, examples, strict=True))
        p.decide("fully_masked", "any", f"{how}: {seen} (not checked: 'any')",
                 dataclasses.replace(conv, fully_masked="any"), examples[kinds.index(kinds[-1])])
        return
    trial = dataclasses.replace(conv, fully_masked=kinds[0])  # type: ignore[arg-type]
    where = " and ".join(sorted({e.dtype for e in examples}, reverse=True))
    sizes = "dv = d" if conv.equal_head_sizes else "dv = d and dv != d"
    p.decide("fully_masked", kinds[0], f"{how}: {_ROW_NAMES[kinds[0]]} ({sizes}, {where})", trial, examples[0])


_ROW_NAMES = {"zero": "zeros", "nan": "NaN", "uniform": "the mean of the values"}


def _row(out: Tensor) -> str:
    values = out[0, ..., 0, :].flatten()[:3].tolist() if out.dim() == 4 else out[0, 0, :3].tolist()
    return "[" + ", ".join(f"{x:.3g}" for x in values) + ", ...]"


def _mask_with_causal(p: _Prober) -> None:
    """``mask_with_causal``: False only when the candidate raises on ``attn_mask`` with ``is_causal=True``."""
    conv = p.conv
    if p.tied:
        t, s = 4, 4
    else:
        t, s = 3, 4
    keep = torch.ones(t, s, dtype=torch.bool)
    keep[:, 0] = False
    keep[0, :] = True  # row 0 keeps key 0 (its only causal key)
    # dv != d and dv = d: some kernels (torch's) refuse the combination on one path only
    for dv, offset in ((3, 8), (4, 9)):
        example = p.example(t=t, s=s, d=4, dv=dv, keep=keep[None, None], is_causal=True, offset=offset)
        out = p.call(conv, example)
        if isinstance(out, Exception) or not p.matches(out, p.reference(conv, example)):
            break
    if isinstance(out, Exception):
        p.decide("mask_with_causal", False, f"attn_mask with is_causal=True (d={example.d}, dv={example.dv}) "
                 f"{_describe(out)}", conv, example)
    elif p.matches(out, p.reference(conv, example)):
        p.decide("mask_with_causal", True, "attn_mask with is_causal=True: both apply", conv, example)
    else:
        mask_only = p.matches(out, p.reference(conv, example, is_causal=False))
        causal_only = p.matches(out, p.reference(conv, example, keep=torch.ones(1, 1, t, s, dtype=torch.bool)))
        what = ("only the mask applies (is_causal ignored)" if mask_only else
                "only the causal mask applies (attn_mask ignored)" if causal_only else "matches neither nor both")
        p.find("mask_with_causal", f"attn_mask with is_causal=True: {what}", conv, example)


# ----------------------------------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------------------------------


def infer_adapter(adapter: Adapter, *, seed: int = 0, candidate: Any = None, longest: int | None = None) -> Inference:
    """Infer the conventions of ``adapter`` (a function's: every field; a module's: the behavioural ones, the spec
    says the rest). ``candidate`` (functions) is read for its signature; ``longest`` (functions): the longest
    length the audit will draw, where ``max_length`` is probed (None: not probed)."""
    import time

    start = time.perf_counter()
    original = adapter.conventions
    p = _Prober(adapter, seed)
    function = adapter.fixed is None
    if function:
        p.conv = dataclasses.replace(original, layout="bhtd", scale=None, supports_gqa=False, enable_gqa=False,
                                     always_causal=False,
                                     decode_sees_all=False, mask_with_causal=True, per_head_masks=True)
        _signature(p, candidate)
        go = _accepted(p) and _scale(p) and _layout(p)
        if go:
            _gqa(p)
            _autograd(p)
            if longest is not None:
                _max_length(p, longest)
    else:
        p.conv = dataclasses.replace(original, always_causal=False, decode_sees_all=False, mask_with_causal=True)
        example = p.example(t=p.square, s=p.square)
        out = p.call(p.conv, example)
        if isinstance(out, Exception):  # XGLM's float32 fill of finfo(float64).min overflows: probe in float32
            p.dtype = "float32"
            single = p.example(t=p.square, s=p.square)
            out32 = p.call(p.conv, single)
            if _any_reference(p, p.conv, single, out32):
                example, out = single, out32
            else:
                p.dtype = "float64"
        go = _any_reference(p, p.conv, example, out)
        if not go:  # every later probe would differ too: one finding, not one per field
            p.find("reference", f"the plainest call (t=s={p.square}, no mask) {_describe(out)} from the reference, "
                   f"plain or causal: the module computes something its spec does not describe, nothing more is "
                   f"inferred", p.conv, example)
    if go:
        _causal(p)
        masks = p.conv.supports_mask and "supports_mask" not in {f.field for f in p.findings}
        if masks:
            masks = _mask(p)
        _fully_masked(p, masks)
        if masks and p.conv.supports_causal and not p.conv.always_causal and not any(
                f.field in ("supports_causal", "causal_alignment") for f in p.findings):
            _mask_with_causal(p)
    adapter.conventions = original
    return Inference(adapter.name, p.conv, p.evidence, p.findings, p.probes, time.perf_counter() - start)


# ----------------------------------------------------------------------------------------------------
# In the report
# ----------------------------------------------------------------------------------------------------


def with_inference(report: AuditReport, inference: Inference) -> AuditReport:
    """The report of an audit under inferred conventions: it opens with them and their evidence, and a
    ``conventions`` row comes first: PASS, or one FAIL per finding (with its input and repro)."""
    report.inferred = inference.lines()
    report.differences = list(inference.differences)
    rows = [CheckResult("conventions", "FAIL", message=str(f), examples=inference.probes,
                        counterexample=None if f.example is None else example_fields(f.example),
                        repro=f.repro or None) for f in inference.findings]
    if not rows:
        rows = [CheckResult("conventions", "PASS", message=f"inferred from {inference.probes} probes",
                            examples=inference.probes)]
    report.results[:0] = rows
    return report


def contradictions(declared: Conventions, inference: Inference) -> list[str]:
    """Where ``declared`` conventions contradict the behaviour: the field, the declared value, the behaviour
    and the witness (what decided it, with its repro); then behaviours that match no convention at all."""
    lines = []
    for name, evidence in inference.evidence.items():
        if not hasattr(declared, name) or evidence.example is None:
            continue
        said, seen = getattr(declared, name), evidence.value
        if said == seen or _narrowing(declared, name, said, seen):
            continue
        lines.append(f"  declared {name}={said!r}; behaves as {seen!r}: {evidence.seen}")
        lines += ["    " + line for line in evidence.repro.splitlines()]
    for finding in inference.findings:
        lines.append(f"  {finding.field}: matches no documented convention: {finding.message}")
        lines += ["    " + line for line in finding.repro.splitlines()]
    if not lines:
        return []
    return ["declared conventions contradicted by the behaviour (found by inference):", *lines]


def _narrowing(declared: Conventions, name: str, said: Any, seen: Any) -> bool:
    """A declaration that only narrows what is drawn (or is not used under the declaration) is no contradiction."""
    if name in ("supports_mask", "supports_causal", "supports_gqa", "per_head_masks", "mask_with_causal"):
        return said is False
    if name == "equal_head_sizes":
        return said is True
    if name in ("head_size_multiple", "length_multiple"):  # multiples of 16 are multiples of 8
        return bool(said % seen == 0)
    narrowing = {"grouping": not declared.supports_gqa, "enable_gqa": not declared.supports_gqa,
                 "mask_kind": said == "additive",
                 "mask_polarity": declared.mask_kind == "additive" or not declared.supports_mask,
                 "fully_masked": said == "any",
                 "causal_alignment": not declared.supports_causal and not declared.always_causal,
                 "decode_sees_all": not declared.supports_causal and not declared.always_causal}
    return bool(narrowing.get(name, False))


# ----------------------------------------------------------------------------------------------------
# What the user knows
# ----------------------------------------------------------------------------------------------------

#: the fields inference decides; a user who knows some passes them as ``known`` with ``conventions="infer"``
INFERRED = ("layout", "mask_polarity", "causal_alignment", "scale", "fully_masked", "supports_mask",
            "supports_causal", "supports_gqa", "enable_gqa", "grouping", "mask_kind", "per_head_masks",
            "mask_with_causal", "decode_sees_all", "always_causal")


def check_known(known: dict[str, Any], decided: Sequence[str] = INFERRED) -> None:
    """``known`` names fields inference decides, with values :class:`Conventions` accepts (else ValueError)."""
    unknown = sorted(set(known) - set(decided))
    if unknown:
        raise ValueError(f"known: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not decided by "
                         f"inference here (known fields: {', '.join(decided)}); pass constraints such as "
                         f"self_attention as options")
    dataclasses.replace(Conventions(), **known)  # the values themselves: Conventions' own ValueError


def _same(name: str, said: Any, seen: Any) -> bool:
    if name == "scale" and isinstance(said, float | int) and isinstance(seen, float | int):
        return _close(float(said), float(seen))
    return bool(said == seen)


def with_known(inference: Inference, known: dict[str, Any]) -> Inference:
    """Inference narrowed by the fields the user knows (``conventions="infer"`` with ``known``). Inference still
    probes every field, then each known one is checked against the behaviour: where they agree, or where the
    known value only narrows what is drawn (``supports_mask=False``, ``fully_masked="any"``, ...), the known
    value is used and its evidence says so; where the behaviour contradicts it, that is a finding naming the
    field, the known value, the behaviour and the witness (the audit FAILs with it, and its checks run on the
    behaviour); a field no probe decided (an earlier finding stopped inference) takes the known value."""
    check_known(known)
    declared = dataclasses.replace(inference.conventions, **known)
    conv, evidence = inference.conventions, dict(inference.evidence)
    findings = [f for f in inference.findings
                if f.declarable is None or not (f.declarable[0] in known
                                                and _same(f.declarable[0], known[f.declarable[0]], f.declarable[1]))]
    for name, said in known.items():
        seen_evidence = evidence.get(name)
        seen = getattr(inference.conventions, name)
        if seen_evidence is None:
            conv = dataclasses.replace(conv, **{name: said})
            evidence[name] = Evidence(name, said, "known (given); no probe decided it")
        elif _same(name, said, seen) or _narrowing(declared, name, said, seen):
            conv = dataclasses.replace(conv, **{name: said})
            how = "confirmed" if _same(name, said, seen) else f"narrows what is drawn; behaves as {seen!r}"
            evidence[name] = dataclasses.replace(seen_evidence, value=said,
                                                 seen=f"known (given), {how}: {seen_evidence.seen}")
        else:
            findings.append(Finding(name, f"known {name}={said!r}; behaves as {seen!r}: {seen_evidence.seen}",
                                    seen_evidence.example, seen_evidence.repro))
    return Inference(inference.candidate, conv, evidence, findings, inference.probes, inference.seconds,
                     inference.differences)


def with_differences(inference: Inference, declared: dict[str, Any], *, head_size: int | None = None
                     ) -> Inference:
    """``inference`` with its :attr:`~Inference.differences`: each decided field (:data:`PAPER`'s) whose value
    differs from the paper's attention, declared when ``declared`` (what the user knows; a module's spec) gives
    it the same value. ``head_size``: a module's, whose scale comes from its spec (declared, listed when it is
    not ``1/sqrt(d)``)."""
    found = []
    for name, (paper, said) in PAPER.items():
        value = getattr(inference.conventions, name)
        evidence = inference.evidence.get(name)
        if name == "scale" and head_size is not None:
            if value is None or _close(float(value), 1 / math.sqrt(head_size)):
                continue
            found.append(Difference(name, value, said, f"the spec's scale (d={head_size})", True))
            continue
        if evidence is None or evidence.example is None or _same(name, paper, value):
            continue  # not decided by a probe (kept as declared), or the paper's
        seen = evidence.seen.removeprefix("known (given), confirmed: ")
        said_so = name in declared and (_same(name, declared[name], value) or (
            # rows that differ by dtype ("any"), one of them the declared kind (Hugging Face's eager kernels)
            name == "fully_masked" and value == "any" and _ROW_NAMES.get(declared[name], "-") in evidence.seen))
        found.append(Difference(name, value, said, seen, said_so))
    return dataclasses.replace(inference, differences=found)
