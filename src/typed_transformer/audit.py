"""Audit a third-party attention implementation against the reference, with Hypothesis as the engine.

    report = audit_attention(torch.nn.functional.scaled_dot_product_attention,
                             conventions=Conventions.torch_sdpa())
    print(report.table())            # PASS / FAIL / SKIP per check, error ratio, counterexample
    assert report.passed

Requires Hypothesis (the ``strategies`` extra); ``import typed_transformer`` does not import this module.

**The candidate** is any callable ``candidate(q, k, v, *, attn_mask=None, is_causal=False)`` written in its
own :class:`Conventions`:

* ``layout="bhtd"``: ``q (b, h, t, d)``, ``k (b, g, s, d)``, ``v (b, g, s, dv)`` -> ``(b, h, t, dv)``;
  ``layout="bthd"`` (FlashAttention's): ``q (b, t, h, d)``, ``k (b, s, g, d)``, ``v (b, s, g, dv)`` ->
  ``(b, t, h, dv)``. ``g == h`` unless ``supports_gqa``.
* ``attn_mask`` is always a boolean ``(b, 1, t, s)``, ``(b, h, t, s)`` or ``(b, 1, 1, s)`` (key padding) mask
  in the candidate's ``mask_polarity`` (``"keep"``: True = may attend, SDPA's; ``"drop"``: True = masked out,
  ``nn.MultiheadAttention``'s). The keyword arguments are passed only when used, so a candidate without
  mask or causal support may take ``(q, k, v)`` only (declare ``supports_mask=False`` /
  ``supports_causal=False``; those checks are then SKIPped).
* ``causal_alignment`` says what ``is_causal=True`` means when ``t != s`` (``"top-left"``: query ``i`` sees
  key ``j <= i``, SDPA's; ``"bottom-right"``: ``j <= i + s - t``, ours and FlashAttention's).
* ``scale``: the logit scale (``None`` = ``1 / sqrt(d)``); ``fully_masked``: what a query row without any
  allowed key returns (``"zero"``, ``"nan"``, ``"uniform"`` = mean of the values, ``"any"`` = not checked).

An adapter maps the canonical inputs (ours: ``bhtd``, keep-masks) to those conventions and the output back,
so a correct implementation with other conventions passes and a wrong one fails.

**Tolerance** (FlashAttention's rule): for the candidate's dtype, ``err = max|candidate - ref64|`` must be at
most ``k * max|ref_lowp - ref64| + 2 eps(dtype) max(1, max|ref64|)``, where ``ref64`` is the reference in float64 and
``ref_lowp`` the same reference run in the candidate's dtype (``k = tolerance``, default 2). The reported
ratio is ``err / max(base, floor)``. Invariance checks compare two candidate outputs with twice that bound.

**Checks** (:data:`CHECKS`): ``reference``, ``scale``, ``causality``, ``batch_independence``, ``permutation``,
``masking``, ``padding``, ``fully_masked``, ``gradients``, ``dtype``. Every check is a Hypothesis test run
programmatically (seeded by ``seed``, ``max_examples`` examples, shrinking on); a failure records the
shrunk example and a Python snippet that reproduces the call.
"""

import dataclasses
import importlib.metadata
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import torch
from einops import einsum, rearrange, reduce, repeat
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from jaxtyping import Bool, Float
from torch import Tensor, nn

from .attention import scaled_dot_product_attention
from .masks import causal_mask, key_padding_mask_to_torch
from .multihead import MultiHeadAttention
from .shapecheck import typechecked
from .strategies import randn

__all__ = [
    "CHECKS",
    "MHA_CHECKS",
    "AuditCase",
    "AuditReport",
    "CheckResult",
    "Conventions",
    "Example",
    "TorchMHAAdapter",
    "audit_attention",
    "audit_multihead",
    "candidate_call",
    "parametrize_audit",
    "reference_attention",
]

Candidate: TypeAlias = Callable[..., Any]
Status: TypeAlias = Literal["PASS", "FAIL", "SKIP"]

#: The checks of :func:`audit_attention`, in the order they run and are reported.
CHECKS: tuple[str, ...] = ("reference", "scale", "causality", "batch_independence", "permutation", "masking",
                           "padding", "fully_masked", "gradients", "dtype")
#: The checks of :func:`audit_multihead`.
MHA_CHECKS: tuple[str, ...] = ("reference", "causality", "masking", "padding", "batch_independence", "gradients",
                               "dtype")
#: Version of the check lists: a passing audit keeps its meaning when checks are added.
#: 2: audit_multihead gained causality and gradients.
CHECKS_VERSION = "2"

_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)
_DTYPE_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
                torch.bfloat16: "bfloat16"}


@dataclass(frozen=True)
class Conventions:
    """What the candidate's arguments mean (see the module docstring). The defaults are ours."""

    layout: Literal["bhtd", "bthd"] = "bhtd"
    mask_polarity: Literal["keep", "drop"] = "keep"
    causal_alignment: Literal["top-left", "bottom-right"] = "bottom-right"
    scale: float | None = None
    fully_masked: Literal["zero", "nan", "uniform", "any"] = "zero"
    supports_mask: bool = True
    supports_causal: bool = True
    supports_gqa: bool = False
    supports_autograd: bool = True

    def __post_init__(self) -> None:
        for name, allowed in (("layout", ("bhtd", "bthd")), ("mask_polarity", ("keep", "drop")),
                              ("causal_alignment", ("top-left", "bottom-right")),
                              ("fully_masked", ("zero", "nan", "uniform", "any"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"Conventions: {name} must be one of {', '.join(allowed)}; "
                                 f"got {getattr(self, name)!r}")

    @classmethod
    def typed_transformer(cls) -> "Conventions":
        """:func:`typed_transformer.scaled_dot_product_attention`'s conventions."""
        return cls(supports_gqa=True)

    @classmethod
    def torch_sdpa(cls) -> "Conventions":
        """``torch.nn.functional.scaled_dot_product_attention``: top-left causal, and fully masked rows give
        NaN or 0 depending on the kernel (not checked)."""
        return cls(causal_alignment="top-left", fully_masked="any")


# ----------------------------------------------------------------------------------------------------
# Reference and inputs
# ----------------------------------------------------------------------------------------------------


def _causal_keep(t: int, s: int, alignment: str) -> Tensor:
    if alignment == "bottom-right":
        return causal_mask(t, s)
    return torch.ones(t, s, dtype=torch.bool).tril()


def reference_attention(
    q: Float[Tensor, "b h t d"],
    k: Float[Tensor, "b g s d"],
    v: Float[Tensor, "b g s dv"],
    keep: Bool[Tensor, "#b #h #t s"] | None = None,
    *,
    is_causal: bool = False,
    conventions: Conventions = Conventions(),
) -> Float[Tensor, "b h t dv"]:
    """Our reference in the candidate's semantics (canonical ``bhtd`` layout, keep-mask ``keep``), computed in
    the dtype of ``q``. Fully masked rows come back as zero."""
    t, s = q.shape[2], k.shape[2]
    if is_causal:
        causal = _causal_keep(t, s, conventions.causal_alignment)
        keep = causal if keep is None else keep & causal
    out = scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=conventions.scale)
    assert isinstance(out, Tensor)
    return out


reference_attention = typechecked(reference_attention)


@dataclass(frozen=True)
class Example:
    """One audit input: sizes, seed, dtype and mask kind; :meth:`inputs` rebuilds the tensors exactly."""

    b: int
    h: int
    g: int
    t: int
    s: int
    d: int
    dv: int
    seed: int
    dtype: str = "float32"
    mask: Literal["none", "keep", "padding", "fully_masked"] = "none"
    is_causal: bool = False

    @property
    def torch_dtype(self) -> torch.dtype:
        return {v: k for k, v in _DTYPE_NAMES.items()}[self.dtype]

    def inputs(self) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Canonical float64 ``q (b,h,t,d)``, ``k (b,g,s,d)``, ``v (b,g,s,dv)`` and keep-mask (or None)."""
        q = randn((self.b, self.h, self.t, self.d), self.seed)
        k = randn((self.b, self.g, self.s, self.d), self.seed + 1)
        v = randn((self.b, self.g, self.s, self.dv), self.seed + 2)
        generator = torch.Generator().manual_seed(self.seed + 3)
        keep: Tensor | None = None
        if self.mask in ("keep", "fully_masked"):
            keep = torch.rand((self.b, 1, self.t, self.s), generator=generator) < 0.5
            index = torch.randint(0, self.s, (self.b, 1, self.t, 1), generator=generator)
            keep = keep.scatter(-1, index, True)
            if self.mask == "fully_masked":
                keep[:, :, 0, :] = False
        elif self.mask == "padding":
            lengths = torch.randint(1, self.s + 1, (self.b, 1, 1, 1), generator=generator)
            keep = rearrange(torch.arange(self.s), "s -> 1 1 1 s") < lengths
        return q, k, v, keep

    def repro(self, candidate: str, conventions: Conventions) -> str:
        """A Python snippet that makes the exact call the audit made."""
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        call = "candidate(*args, **kwargs)"
        return (f"from typed_transformer.audit import Conventions, Example, candidate_call\n"
                f"example = Example({fields})\n"
                f"args, kwargs = candidate_call(example, {conventions!r})\n"
                f"out = {call}  # candidate = {candidate}")


def candidate_call(example: Example, conventions: Conventions) -> tuple[tuple[Tensor, Tensor, Tensor], dict[str, Any]]:
    """The positional and keyword arguments the audit passes to the candidate for ``example``."""
    q, k, v, keep = example.inputs()
    return _to_candidate(q, k, v, keep, example.is_causal, example.torch_dtype, conventions)


def _to_candidate(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, is_causal: bool, dtype: torch.dtype,
                  conventions: Conventions) -> tuple[tuple[Tensor, Tensor, Tensor], dict[str, Any]]:
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if conventions.layout == "bthd":
        q, k, v = (rearrange(x, "b h t d -> b t h d") for x in (q, k, v))
    kwargs: dict[str, Any] = {}
    if keep is not None:
        kwargs["attn_mask"] = keep if conventions.mask_polarity == "keep" else ~keep
    if is_causal:
        kwargs["is_causal"] = True
    return (q.contiguous(), k.contiguous(), v.contiguous()), kwargs


def _from_candidate(out: Tensor, conventions: Conventions) -> Tensor:
    return rearrange(out, "b t h d -> b h t d") if conventions.layout == "bthd" else out


# ----------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------


@dataclass
class CheckResult:
    """The outcome of one check: status, worst error ratio seen, and the shrunk counterexample on FAIL."""

    name: str
    status: Status
    ratio: float | None = None
    message: str = ""
    counterexample: dict[str, Any] | None = None
    repro: str | None = None
    examples: int = 0


@dataclass
class AuditReport:
    """Per-check results; ``str(report)`` is :meth:`table`."""

    candidate: str
    conventions: dict[str, Any]
    results: list[CheckResult]
    seed: int
    max_examples: int
    dtypes: list[str]
    tolerance: float
    environment: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """No check failed (SKIPs are allowed)."""
        return not self.failed

    @property
    def failed(self) -> list[str]:
        return [r.name for r in self.results if r.status == "FAIL"]

    def __getitem__(self, name: str) -> CheckResult:
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(name)

    def table(self) -> str:
        """A plain-text table, one row per check, then the counterexample of every failure."""
        rows = [("check", "status", "ratio", "detail")]
        for r in self.results:
            ratio = "-" if r.ratio is None else f"{r.ratio:.3g}"
            rows.append((r.name, r.status, ratio, r.message.splitlines()[0] if r.message else ""))
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = [f"audit of {self.candidate} (seed {self.seed}, {self.max_examples} examples per check, "
                 f"dtypes {', '.join(self.dtypes)}, tolerance {self.tolerance:g}x reference error)"]
        for index, row in enumerate(rows):
            lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3])
            if index == 0:
                lines.append("  ".join("-" * w for w in widths) + "  ------")
        for r in self.results:
            if r.status == "FAIL" and r.repro:
                lines += ["", f"{r.name}: counterexample {json.dumps(r.counterexample)}", r.repro]
        passed = sum(r.status == "PASS" for r in self.results)
        skipped = sum(r.status == "SKIP" for r in self.results)
        lines += ["", f"{passed} passed, {len(self.failed)} failed, {skipped} skipped"]
        return "\n".join(lines)

    __str__ = table

    def to_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate, "checks_version": CHECKS_VERSION, "passed": self.passed,
                "conventions": self.conventions, "seed": self.seed, "max_examples": self.max_examples,
                "dtypes": self.dtypes, "tolerance": self.tolerance, "environment": self.environment,
                "results": [dataclasses.asdict(r) for r in self.results]}

    def to_json(self, path: str | None = None) -> str:
        """The report as JSON (written to ``path`` too when given)."""
        text = json.dumps(self.to_dict(), indent=2, default=str)
        if path is not None:
            with open(path, "w", encoding="utf-8") as file:
                file.write(text + "\n")
        return text


def _environment() -> dict[str, Any]:
    return {"torch": torch.__version__, "typed_transformer": importlib.metadata.version("typed-transformer"),
            "deterministic": torch.are_deterministic_algorithms_enabled(), "device": "cpu"}


# ----------------------------------------------------------------------------------------------------
# Check machinery
# ----------------------------------------------------------------------------------------------------


class _CheckFailure(AssertionError):
    def __init__(self, message: str, example: Example | None, ratio: float | None = None) -> None:
        super().__init__(message)
        self.example = example
        self.ratio = ratio


class _Skip(Exception):
    pass


@dataclass
class _Run:
    """State shared by the examples of one check: worst passing ratio, last failure (the shrunk one)."""

    worst: float = 0.0
    failure: _CheckFailure | None = None
    examples: int = 0


def _bound(ref64: Tensor, reflow: Tensor, tolerance: float, dtype: torch.dtype,
           rows: Tensor | None = None, floor_ulps: float = 2.0, amplification: float = 1.0) -> tuple[float, float]:
    """``(allowed error, base)`` by the FlashAttention rule, over ``rows`` (bool ``(b, h, t, 1)``) only.

    The floor (for a reference error of 0, as in float64) is ``floor_ulps`` units in the last place at
    ``max(1, max|ref|)``, times ``amplification`` (the largest ``|q| . |k| * scale``: a rounding error in
    a logit ``x`` changes ``exp(x)`` by ``x`` times as much).
    """
    ref64, reflow = ref64.detach(), reflow.detach()
    diff = (reflow.double() - ref64).abs()
    scale_ = ref64.abs()
    if rows is not None:
        diff, scale_ = diff.masked_fill(~rows, 0.0), scale_.masked_fill(~rows, 0.0)
    base = float(diff.max()) if diff.numel() else 0.0
    floor = floor_ulps * torch.finfo(dtype).eps * max(float(scale_.max()) if scale_.numel() else 0.0, 1.0)
    floor *= max(amplification, 1.0)
    return tolerance * base + floor, max(base, floor)


def _error(out: Tensor, expected: Tensor, rows: Tensor | None = None) -> float:
    """``max|out - expected|``; NaN or inf anywhere (in ``rows``) counts as an infinite error."""
    out, expected = out.detach().double(), expected.detach().double()
    if rows is not None:
        rows = rows.expand_as(out)
        out, expected = out[rows], expected[rows]
    if out.numel() == 0:
        return 0.0
    if not torch.isfinite(out).all():
        return math.inf
    return float((out - expected).abs().max())


@dataclass
class _Auditor:
    candidate: Candidate
    conventions: Conventions
    dtypes: tuple[torch.dtype, ...]
    tolerance: float
    name: str

    def call(self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, is_causal: bool,
             dtype: torch.dtype) -> Tensor:
        args, kwargs = _to_candidate(q, k, v, keep, is_causal, dtype, self.conventions)
        out = self.candidate(*args, **kwargs)
        if not isinstance(out, Tensor):
            raise _CheckFailure(f"returned {type(out).__name__}, expected a tensor", None)
        return _from_candidate(out, self.conventions)

    def refs(self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, is_causal: bool,
             dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        ref64 = reference_attention(q, k, v, keep, is_causal=is_causal, conventions=self.conventions)
        reflow = reference_attention(q.to(dtype), k.to(dtype), v.to(dtype), keep, is_causal=is_causal,
                                     conventions=self.conventions)
        return ref64, reflow

    def amplification(self, q: Tensor, k: Tensor) -> float:
        """The largest ``|q| . |k| * scale`` (how much a logit's rounding error is amplified)."""
        scale = self.conventions.scale if self.conventions.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        if not (q.numel() and k.numel()):
            return 1.0
        grouped = rearrange(q.abs(), "b (g r) t d -> b g r t d", g=k.shape[1])
        return float(einsum(grouped, k.abs(), "b g r t d, b g s d -> b g r t s").max()) * abs(scale)

    def live_rows(self, example: Example, keep: Tensor | None, is_causal: bool) -> Tensor:
        t, s = example.t, example.s
        rows = torch.ones(example.b, example.h, t, s, dtype=torch.bool)
        if keep is not None:
            rows = rows & keep
        if is_causal:
            rows = rows & _causal_keep(t, s, self.conventions.causal_alignment)
        return rows.any(dim=-1, keepdim=True)

    def compare(self, run: _Run, example: Example, keep: Tensor | None = None, is_causal: bool = False,
                what: str = "output") -> tuple[Tensor, float]:
        """Call the candidate on ``example`` and apply the FlashAttention rule; return (output, allowed)."""
        q, k, v, _ = example.inputs()
        dtype = example.torch_dtype
        out = self.call(q, k, v, keep, is_causal, dtype)
        expected_shape = (example.b, example.h, example.t, example.dv)
        if tuple(out.shape) != expected_shape:
            raise _CheckFailure(f"output shape {tuple(out.shape)} (canonical bhtd), expected {expected_shape}",
                                example)
        ref64, reflow = self.refs(q, k, v, keep, is_causal, dtype)
        rows = self.live_rows(example, keep, is_causal)
        allowed, base = _bound(ref64, reflow, self.tolerance, dtype, rows, amplification=self.amplification(q, k))
        err = _error(out, ref64, rows)
        ratio = err / base
        if not err <= allowed:
            raise _CheckFailure(f"{what}: max error {err:.3g} > allowed {allowed:.3g} "
                                f"(ratio {ratio:.3g} to the reference's own error {base:.3g})", example, ratio)
        run.worst = max(run.worst, ratio)
        return out, allowed

    def same(self, a: Tensor, b: Tensor, allowed: float, example: Example, what: str) -> None:
        err = _error(a, b)
        if not err <= 2 * allowed:
            raise _CheckFailure(f"{what}: outputs differ by {err:.3g} > {2 * allowed:.3g}", example)


def _sizes(draw: Callable[..., Any], conventions: Conventions, *, max_len: int = 6, min_d: int = 1,
           max_d: int = 8, same_length: bool = False, min_batch: int = 1) -> dict[str, int]:
    b = draw(st.integers(min_batch, 3), label="b")
    g = draw(st.integers(1, 3), label="g")
    r = draw(st.integers(1, 2), label="r") if conventions.supports_gqa else 1
    t = draw(st.integers(1, max_len), label="t")
    s = t if same_length else draw(st.integers(1, max_len), label="s")
    d = draw(st.integers(min_d, max_d), label="d")
    dv = draw(st.sampled_from([d, max(1, d // 2 + 1)]), label="dv")
    return {"b": b, "h": g * r, "g": g, "t": t, "s": s, "d": d, "dv": dv}


def _run_check(body: Callable[[st.DataObject, _Run], None], *, max_examples: int, seed: int,
               name: str, candidate: str, conventions: Conventions) -> CheckResult:
    run = _Run()

    @settings(max_examples=max_examples, deadline=None, database=None, derandomize=False, phases=_PHASES,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False, print_blob=False)
    @hypothesis_seed(seed)
    @given(st.data())
    def test(data: st.DataObject) -> None:
        run.examples += 1
        try:
            body(data, run)
        except (_CheckFailure, _Skip):
            raise
        except Exception as err:  # the candidate raised: that is a failure of this check
            first_line = str(err).splitlines()[0] if str(err) else ""
            raise _CheckFailure(f"candidate raised {type(err).__name__}: {first_line}", None) from err

    try:
        test()
    except _Skip as skip:
        return CheckResult(name, "SKIP", message=str(skip))
    except _CheckFailure as failure:
        example = failure.example
        return CheckResult(name, "FAIL", ratio=failure.ratio, message=str(failure),
                           counterexample=None if example is None else dataclasses.asdict(example),
                           repro=None if example is None else example.repro(candidate, conventions),
                           examples=run.examples)
    return CheckResult(name, "PASS", ratio=run.worst, examples=run.examples)


def _with_example(run: _Run, failure_example: Example, fn: Callable[[], object]) -> None:
    try:
        fn()
    except _CheckFailure as failure:
        if failure.example is None:
            failure.example = failure_example
        raise


# ----------------------------------------------------------------------------------------------------
# The checks
# ----------------------------------------------------------------------------------------------------


def _check_bodies(a: _Auditor) -> dict[str, Callable[[st.DataObject, _Run], None]]:
    conv = a.conventions

    def draw_example(data: st.DataObject, **kwargs: Any) -> Example:
        mask = kwargs.pop("mask", "none")
        is_causal = kwargs.pop("is_causal", False)
        dtype = data.draw(st.sampled_from(list(a.dtypes)), label="dtype")
        sizes = _sizes(data.draw, conv, **kwargs)
        seed = data.draw(st.integers(0, 2**31), label="seed")
        return Example(**sizes, seed=seed, dtype=_DTYPE_NAMES[dtype], mask=mask, is_causal=is_causal)

    def reference(data: st.DataObject, run: _Run) -> None:
        example = draw_example(data)
        _with_example(run, example, lambda: a.compare(run, example))

    def scale(data: st.DataObject, run: _Run) -> None:
        # Large head sizes: a wrong logit scale (missing or sqrt(d) applied twice) changes the output a lot.
        example = draw_example(data, min_d=16, max_d=64)
        _with_example(run, example, lambda: a.compare(run, example, what="scale"))

    def causality(data: st.DataObject, run: _Run) -> None:
        if not conv.supports_causal:
            raise _Skip("supports_causal=False")
        example = draw_example(data, is_causal=True)

        def go() -> None:
            out, allowed = a.compare(run, example, is_causal=True, what="is_causal=True")
            # Perturbing keys/values a query may not see must not change that query's output.
            q, k, v, _ = example.inputs()
            t, s = example.t, example.s
            visible = _causal_keep(t, s, conv.causal_alignment)
            for i in range(t):
                future = ~visible[i]
                if not future.any():
                    continue
                k2, v2 = k.clone(), v.clone()
                k2[:, :, future] += 3.0
                v2[:, :, future] -= 5.0
                out2 = a.call(q, k2, v2, None, True, example.torch_dtype)
                rows = a.live_rows(example, None, True)[:, :, i:i + 1]
                err = _error(out2[:, :, i:i + 1], out[:, :, i:i + 1], rows)
                if not err <= 2 * allowed:
                    raise _CheckFailure(f"query {i} changed by {err:.3g} when keys it may not see changed "
                                        f"({conv.causal_alignment} alignment)", example)
                break

        _with_example(run, example, go)

    def batch_independence(data: st.DataObject, run: _Run) -> None:
        example = draw_example(data, min_batch=2)

        def go() -> None:
            out, allowed = a.compare(run, example, what="batched output")
            q, k, v, _ = example.inputs()
            for i in range(example.b):
                single = a.call(q[i:i + 1], k[i:i + 1], v[i:i + 1], None, False, example.torch_dtype)
                a.same(out[i:i + 1], single, allowed, example, f"batch element {i} alone vs in the batch")

        _with_example(run, example, go)

    def permutation(data: st.DataObject, run: _Run) -> None:
        example = draw_example(data)
        key_perm = torch.tensor(data.draw(st.permutations(range(example.s)), label="key_perm"))
        query_perm = torch.tensor(data.draw(st.permutations(range(example.t)), label="query_perm"))

        def go() -> None:
            out, allowed = a.compare(run, example)
            q, k, v, _ = example.inputs()
            dtype = example.torch_dtype
            permuted_keys = a.call(q, k[:, :, key_perm], v[:, :, key_perm], None, False, dtype)
            a.same(permuted_keys, out, allowed, example, f"keys and values permuted by {key_perm.tolist()}")
            permuted_queries = a.call(q[:, :, query_perm], k, v, None, False, dtype)
            a.same(permuted_queries, out[:, :, query_perm], allowed, example,
                   f"queries permuted by {query_perm.tolist()}")

        _with_example(run, example, go)

    def masking(data: st.DataObject, run: _Run) -> None:
        if not conv.supports_mask:
            raise _Skip("supports_mask=False")
        example = draw_example(data, mask="keep")

        def go() -> None:
            _, _, _, keep = example.inputs()
            a.compare(run, example, keep=keep, what=f"boolean attn_mask ({conv.mask_polarity} polarity)")

        _with_example(run, example, go)

    def padding(data: st.DataObject, run: _Run) -> None:
        if not conv.supports_mask:
            raise _Skip("supports_mask=False")
        example = draw_example(data, mask="padding")

        def go() -> None:
            q, k, v, keep = example.inputs()
            assert keep is not None
            out, allowed = a.compare(run, example, keep=keep, what="key padding mask (b, 1, 1, s)")
            for i in range(example.b):
                n = int(keep[i].sum())
                truncated = a.call(q[i:i + 1], k[i:i + 1, :, :n], v[i:i + 1, :, :n], None, False,
                                   example.torch_dtype)
                a.same(out[i:i + 1], truncated, allowed, example, f"batch element {i}: padding to {example.s} "
                       f"vs truncation to {n} keys")

        _with_example(run, example, go)

    def fully_masked(data: st.DataObject, run: _Run) -> None:
        if not conv.supports_mask:
            raise _Skip("supports_mask=False")
        if conv.fully_masked == "any":
            raise _Skip("fully_masked='any' declared")
        example = draw_example(data, mask="fully_masked")

        def go() -> None:
            q, k, v, keep = example.inputs()
            out = a.call(q, k, v, keep, False, example.torch_dtype)
            row = out[:, :, 0].double()
            if conv.fully_masked == "zero":
                ok, want = bool(torch.isfinite(row).all() and (row == 0).all()), "zeros"
            elif conv.fully_masked == "nan":
                ok, want = bool(row.isnan().all()), "NaN"
            else:
                mean = repeat(reduce(v, "b g s d -> b g d", "mean"), "b g d -> b (g r) d", r=example.h // example.g)
                ok, want = bool(_error(row, mean) <= 1e-2 * max(1.0, float(mean.abs().max()))), "the mean of v"
            if not ok:
                raise _CheckFailure(f"fully masked query row 0 gave {row.flatten()[:4].tolist()}..., declared "
                                    f"{conv.fully_masked!r} ({want})", example)
            live = a.live_rows(example, keep, False)
            ref64 = reference_attention(q, k, v, keep, conventions=conv)
            if not math.isfinite(_error(out, ref64, live)):
                raise _CheckFailure("rows with allowed keys are not finite next to a fully masked row", example)

        _with_example(run, example, go)

    def gradients(data: st.DataObject, run: _Run) -> None:
        if not conv.supports_autograd:
            raise _Skip("supports_autograd=False")
        example = draw_example(data)

        def go() -> None:
            q, k, v, _ = example.inputs()
            dtype = example.torch_dtype
            cotangent = randn((example.b, example.h, example.t, example.dv), example.seed + 4)

            def grads(fn: Callable[[Tensor, Tensor, Tensor], Tensor], dt: torch.dtype) -> list[Tensor]:
                leaves = [x.to(dt).detach().requires_grad_(True) for x in (q, k, v)]
                out = fn(*leaves)
                torch.autograd.backward([(out.double() * cotangent).sum()])
                return [x.grad if x.grad is not None else torch.zeros_like(x) for x in leaves]

            def ref(x: Tensor, y: Tensor, z: Tensor) -> Tensor:
                return reference_attention(x, y, z, conventions=conv)

            def cand(x: Tensor, y: Tensor, z: Tensor) -> Tensor:
                args, kwargs = _to_candidate(x, y, z, None, False, x.dtype, conv)
                # keep the leaves: transpose views instead of contiguous copies
                if conv.layout == "bthd":
                    args = (rearrange(x, "b h t d -> b t h d"), rearrange(y, "b h t d -> b t h d"),
                            rearrange(z, "b h t d -> b t h d"))
                else:
                    args = (x, y, z)
                return _from_candidate(a.candidate(*args, **kwargs), conv)

            g64, glow, gcand = grads(ref, torch.float64), grads(ref, dtype), grads(cand, dtype)
            for name, r64, rlow, c in zip("qkv", g64, glow, gcand, strict=True):
                allowed, base = _bound(r64, rlow, a.tolerance, dtype, floor_ulps=16.0,
                                       amplification=a.amplification(q, k))
                err = _error(c, r64)
                if not err <= allowed:
                    raise _CheckFailure(f"d{name}: max error {err:.3g} > allowed {allowed:.3g}", example, err / base)
                run.worst = max(run.worst, err / base)

        _with_example(run, example, go)

    def dtype_check(data: st.DataObject, run: _Run) -> None:
        example = draw_example(data)

        def go() -> None:
            q, k, v, _ = example.inputs()
            out = a.call(q, k, v, None, False, example.torch_dtype)
            if out.dtype != example.torch_dtype:
                raise _CheckFailure(f"output dtype {out.dtype}, inputs {example.torch_dtype}", example)

        _with_example(run, example, go)

    return {"reference": reference, "scale": scale, "causality": causality,
            "batch_independence": batch_independence, "permutation": permutation, "masking": masking,
            "padding": padding, "fully_masked": fully_masked, "gradients": gradients, "dtype": dtype_check}


def _name_of(candidate: object) -> str:
    module = getattr(candidate, "__module__", None)
    qualname = getattr(candidate, "__qualname__", None) or type(candidate).__name__
    return f"{module}:{qualname}" if module else str(qualname)


def _select(checks: Sequence[str] | None, known: tuple[str, ...]) -> list[str]:
    selected = list(known) if checks is None else list(checks)
    unknown = [c for c in selected if c not in known]
    if unknown:
        raise ValueError(f"unknown check {unknown[0]!r}; choose from {', '.join(known)}")
    return selected


def audit_attention(
    candidate: Candidate,
    *,
    conventions: Conventions = Conventions(),
    checks: Sequence[str] | None = None,
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float64),
    max_examples: int = 20,
    seed: int = 0,
    tolerance: float = 2.0,
    name: str | None = None,
) -> AuditReport:
    """Run the attention checks (:data:`CHECKS`, or the subset ``checks``) on ``candidate``.

    Args:
        candidate: ``candidate(q, k, v, *, attn_mask=None, is_causal=False)`` in ``conventions``.
        conventions: the candidate's layout, mask polarity, causal alignment, scale, fully-masked rows and
            supported features.
        checks: names from :data:`CHECKS` (default: all).
        dtypes: floating dtypes the inputs are drawn in (each example draws one).
        max_examples: Hypothesis examples per check.
        seed: Hypothesis seed; the same seed gives the same examples and the same report.
        tolerance: ``k`` in ``err <= k * reference_error + eps * max|ref|``.
        name: how the report names the candidate (default ``module:qualname``).
    """
    selected = _select(checks, CHECKS)
    if tolerance <= 0 or max_examples <= 0:
        raise ValueError("audit_attention: tolerance and max_examples must be positive")
    label = name or _name_of(candidate)
    auditor = _Auditor(candidate, conventions, tuple(dtypes), tolerance, label)
    bodies = _check_bodies(auditor)
    results = [_run_check(bodies[check], max_examples=max_examples, seed=seed, name=check, candidate=label,
                          conventions=conventions) for check in selected]
    return AuditReport(label, dataclasses.asdict(conventions), results, seed, max_examples,
                       [_DTYPE_NAMES[d] for d in dtypes], tolerance, _environment())


# ----------------------------------------------------------------------------------------------------
# Multi-head modules
# ----------------------------------------------------------------------------------------------------


class TorchMHAAdapter:
    """Weight-loading adapter for ``torch.nn.MultiheadAttention``: copies its weights into our
    :class:`~typed_transformer.MultiHeadAttention` (the reference) and calls it batch-first with our masks
    (keep-masks), converting them to torch's polarity and layout."""

    def __init__(self, module: nn.MultiheadAttention) -> None:
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"TorchMHAAdapter: expected nn.MultiheadAttention, got {type(module).__name__}")
        self.module = module.eval()
        self.num_heads = module.num_heads
        self.embed_dim = module.embed_dim
        self.kdim, self.vdim = module.kdim, module.vdim

    def reference(self) -> MultiHeadAttention:
        """Our module with the candidate's weights (float64)."""
        return MultiHeadAttention.from_torch(self.module, backend="reference").double().eval()

    def __call__(self, query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                 key_padding_mask: Tensor | None = None, *, is_causal: bool = False,
                 grad: bool = False) -> Tensor:
        """Batch-first call; ``attn_mask (b, t, s)`` keep-mask and ``key_padding_mask (b, s)`` True = real.

        ``is_causal``: our bottom-right causal mask, passed to torch as an explicit ``attn_mask`` (torch's
        own ``is_causal`` is only a hint that such a mask is given). ``grad``: keep the autograd graph.
        """
        module = self.module.to(query.dtype)
        keep = attn_mask
        if is_causal:
            causal = causal_mask(query.shape[1], key.shape[1], device=query.device)
            keep = repeat(causal, "t s -> b t s", b=query.shape[0]) if keep is None else keep & causal
        torch_mask = None
        if keep is not None:
            torch_mask = repeat(~keep, "b t s -> (b h) t s", h=self.num_heads)  # batch-major, True = masked
        padding = None if key_padding_mask is None else key_padding_mask_to_torch(key_padding_mask)
        if not module.batch_first:
            query, key, value = (rearrange(x, "b t e -> t b e") for x in (query, key, value))
        with torch.set_grad_enabled(grad):
            out, _ = module(query, key, value, attn_mask=torch_mask, key_padding_mask=padding, need_weights=False)
        result: Tensor = out if module.batch_first else rearrange(out, "t b e -> b t e")
        return result


def audit_multihead(
    module: nn.MultiheadAttention | Callable[[], nn.MultiheadAttention],
    *,
    checks: Sequence[str] | None = None,
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float64),
    max_examples: int = 10,
    seed: int = 0,
    tolerance: float = 2.0,
) -> AuditReport:
    """Audit a multi-head attention module (or a factory of one) through :class:`TorchMHAAdapter`.

    The module's weights are copied into our ``MultiHeadAttention``; its outputs are compared with ours in
    float64 by the same rule as :func:`audit_attention` (checks :data:`MHA_CHECKS`): plain cross-attention,
    a bottom-right causal mask (given to torch as an explicit ``attn_mask``) together with a test that
    queries ignore keys they may not see, keep-masks, key padding, batch independence, the gradients with
    respect to query, key and value, and the output dtype.
    """
    selected = _select(checks, MHA_CHECKS)
    candidate = module if isinstance(module, nn.MultiheadAttention) else module()
    adapter = TorchMHAAdapter(candidate)
    ours = adapter.reference()
    label = f"{type(candidate).__module__}.{type(candidate).__qualname__}({adapter.embed_dim}, {adapter.num_heads})"
    dtype_names = {v: k for k, v in _DTYPE_NAMES.items()}

    def draw(data: st.DataObject, mask: str, *, causal: bool = False
             ) -> tuple[Example, Tensor, Tensor, Tensor, Tensor | None]:
        dtype = data.draw(st.sampled_from(list(dtypes)), label="dtype")
        b = data.draw(st.integers(1, 3), label="b")
        t = data.draw(st.integers(1, 5), label="t")
        # causal: s >= t, so that with bottom-right alignment every query sees at least one key
        s = data.draw(st.integers(t if causal else 1, 5), label="s")
        seed_ = data.draw(st.integers(0, 2**31), label="seed")
        example = Example(b=b, h=adapter.num_heads, g=adapter.num_heads, t=t, s=s, d=adapter.embed_dim,
                          dv=adapter.embed_dim, seed=seed_, dtype=_DTYPE_NAMES[dtype], mask=mask,  # type: ignore[arg-type]
                          is_causal=causal)
        x = randn((b, t, adapter.embed_dim), seed_)
        key = randn((b, s, adapter.kdim), seed_ + 1)
        value = randn((b, s, adapter.vdim), seed_ + 2)
        _, _, _, keep = example.inputs()
        return example, x, key, value, keep

    def low_reference(dtype: torch.dtype) -> MultiHeadAttention:
        """Our module with the candidate's weights in the candidate's dtype (its own rounding error)."""
        low = MultiHeadAttention.from_torch(adapter.module.double(), backend="reference").to(dtype).eval()
        adapter.module.to(dtype)
        return low

    def compare(run: _Run, example: Example, x: Tensor, key: Tensor, value: Tensor, keep: Tensor | None,
                padding: bool) -> tuple[Tensor, float]:
        dtype = dtype_names[example.dtype]
        kwargs: dict[str, Tensor | None] = {}
        if keep is not None:
            kwargs = {"key_padding_mask": keep[:, 0, 0]} if padding else {"attn_mask": keep[:, 0]}
        causal = example.is_causal
        out = adapter(x.to(dtype), key.to(dtype), value.to(dtype), attn_mask=kwargs.get("attn_mask"),
                      key_padding_mask=kwargs.get("key_padding_mask"), is_causal=causal)
        ref64, _ = ours(x, key, value, **kwargs, is_causal=causal)
        reflow, _ = low_reference(dtype)(x.to(dtype), key.to(dtype), value.to(dtype), **kwargs, is_causal=causal)
        allowed, base = _bound(ref64, reflow, tolerance, dtype, floor_ulps=8.0)
        err = _error(out, ref64)
        if tuple(out.shape) != tuple(ref64.shape):
            raise _CheckFailure(f"output shape {tuple(out.shape)}, expected {tuple(ref64.shape)}", example)
        if not err <= allowed:
            raise _CheckFailure(f"max error {err:.3g} > allowed {allowed:.3g}", example, err / base)
        run.worst = max(run.worst, err / base)
        return out, allowed

    def reference(data: st.DataObject, run: _Run) -> None:
        example, x, key, value, _ = draw(data, "none")
        compare(run, example, x, key, value, None, False)

    def masking(data: st.DataObject, run: _Run) -> None:
        example, x, key, value, keep = draw(data, "keep")
        compare(run, example, x, key, value, keep, False)

    def padding(data: st.DataObject, run: _Run) -> None:
        example, x, key, value, keep = draw(data, "padding")
        compare(run, example, x, key, value, keep, True)

    def causality(data: st.DataObject, run: _Run) -> None:
        example, x, key, value, _ = draw(data, "none", causal=True)
        out, allowed = compare(run, example, x, key, value, None, False)
        # Changing keys and values a query may not see must not change that query's output.
        dtype = dtype_names[example.dtype]
        visible = causal_mask(example.t, example.s)
        for i in range(example.t):
            future = ~visible[i]
            if not future.any():
                continue
            key2, value2 = key.clone(), value.clone()
            key2[:, future] += 3.0
            value2[:, future] -= 5.0
            out2 = adapter(x.to(dtype), key2.to(dtype), value2.to(dtype), is_causal=True)
            err = _error(out2[:, i], out[:, i])
            if not err <= 2 * allowed:
                raise _CheckFailure(f"query {i} changed by {err:.3g} when keys it may not see changed "
                                    "(bottom-right alignment)", example)
            break

    def gradients(data: st.DataObject, run: _Run) -> None:
        example, x, key, value, _ = draw(data, "none")
        dtype = dtype_names[example.dtype]
        cotangent = randn((example.b, example.t, adapter.embed_dim), example.seed + 4)

        def grads(fn: Callable[[Tensor, Tensor, Tensor], Tensor], dt: torch.dtype) -> list[Tensor]:
            leaves = [z.to(dt).detach().requires_grad_(True) for z in (x, key, value)]
            torch.autograd.backward([(fn(*leaves).double() * cotangent).sum()])
            return [z.grad if z.grad is not None else torch.zeros_like(z) for z in leaves]

        low = low_reference(dtype)
        g64 = grads(lambda q, k, v: ours(q, k, v)[0], torch.float64)
        glow = grads(lambda q, k, v: low(q, k, v)[0], dtype)
        saved = [(p, p.grad) for p in adapter.module.parameters()]
        try:
            gcand = grads(lambda q, k, v: adapter(q, k, v, grad=True), dtype)
        finally:
            for p, grad in saved:  # the audit leaves the candidate's .grad as it found it
                p.grad = grad
        for name, r64, rlow, c in zip(("query", "key", "value"), g64, glow, gcand, strict=True):
            allowed, base = _bound(r64, rlow, tolerance, dtype, floor_ulps=16.0)
            err = _error(c, r64)
            if not err <= allowed:
                raise _CheckFailure(f"d{name}: max error {err:.3g} > allowed {allowed:.3g}", example, err / base)
            run.worst = max(run.worst, err / base)

    def batch_independence(data: st.DataObject, run: _Run) -> None:
        example, x, key, value, _ = draw(data, "none")
        out, allowed = compare(run, example, x, key, value, None, False)
        dtype = dtype_names[example.dtype]
        for i in range(example.b):
            single = adapter(x[i:i + 1].to(dtype), key[i:i + 1].to(dtype), value[i:i + 1].to(dtype))
            err = _error(single, out[i:i + 1])
            if not err <= 2 * allowed:
                raise _CheckFailure(f"batch element {i} alone differs by {err:.3g}", example)

    def dtype_check(data: st.DataObject, run: _Run) -> None:
        example, x, key, value, _ = draw(data, "none")
        dtype = dtype_names[example.dtype]
        out = adapter(x.to(dtype), key.to(dtype), value.to(dtype))
        if out.dtype != dtype:
            raise _CheckFailure(f"output dtype {out.dtype}, inputs {dtype}", example)

    bodies = {"reference": reference, "causality": causality, "masking": masking, "padding": padding,
              "batch_independence": batch_independence, "gradients": gradients, "dtype": dtype_check}
    conventions = Conventions(mask_polarity="drop", fully_masked="any")
    results = [_run_check(bodies[check], max_examples=max_examples, seed=seed, name=check, candidate=label,
                          conventions=conventions) for check in selected]
    return AuditReport(label, {"adapter": "TorchMHAAdapter"}, results, seed, max_examples,
                       [_DTYPE_NAMES[d] for d in dtypes], tolerance, _environment())


# ----------------------------------------------------------------------------------------------------
# pytest integration
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditCase:
    """One check of an audit, as a pytest parameter: ``case.run()`` passes, fails or skips the test."""

    candidate: Candidate
    check: str
    conventions: Conventions
    options: tuple[tuple[str, Any], ...] = ()

    def run(self) -> CheckResult:
        import pytest

        report = audit_attention(self.candidate, conventions=self.conventions, checks=[self.check],
                                 **dict(self.options))
        result = report.results[0]
        if result.status == "SKIP":
            pytest.skip(result.message)
        if result.status == "FAIL":
            pytest.fail(f"{self.check}: {result.message}\n{result.repro or ''}", pytrace=False)
        return result


def parametrize_audit(candidate: Candidate, *, conventions: Conventions = Conventions(),
                      checks: Sequence[str] | None = None, **options: Any) -> Any:
    """``pytest.mark.parametrize`` over the audit's checks: one test item per check, with the check's name
    as its id::

        @parametrize_audit(my_attention, conventions=Conventions(layout="bthd"))
        def test_my_attention(audit_case):
            audit_case.run()

    ``options`` go to :func:`audit_attention` (``dtypes``, ``max_examples``, ``seed``, ``tolerance``).
    """
    import pytest

    cases = [AuditCase(candidate, check, conventions, tuple(sorted(options.items())))
             for check in _select(checks, CHECKS)]
    return pytest.mark.parametrize("audit_case", [pytest.param(case, id=case.check) for case in cases])
