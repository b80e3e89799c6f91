"""Functional candidates ``candidate(q, k, v, *, attn_mask=None, is_causal=False)``: the adapter, the audit
entry point and the pytest integration."""

import dataclasses
import inspect
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from einops import einsum, rearrange
from jaxtyping import Bool, Float, Float64
from torch import Tensor

from ...shapecheck import shape_checked, typechecked
from .causes import group
from .conventions import (
    DEFAULT_CONVENTIONS,
    DTYPE_NAMES,
    AuditUsageError,
    CandidateOutput,
    Conventions,
    FunctionInputs,
    KeepMask,
)
from .examples import Example, import_line
from .inference import (
    INFERRED,
    Inference,
    check_known,
    contradictions,
    infer_adapter,
    with_differences,
    with_inference,
    with_known,
)
from .isolation import IsolatedCandidate
from .reference import reference_attention
from .report import Adapter, AuditReport, CheckResult, environment
from .running import (
    REGISTRY,
    Budget,
    CandidateRaised,
    CheckFailure,
    audit_threads,
    candidate_code,
    collect_state_changes,
    modified,
    note_change,
    resolve_budget,
    run_check,
    subclass_note,
)
from .trusted import check_trusted

Candidate = Callable[..., Any]
#: ``q``, ``k``, ``v`` as the candidate takes them: its layout (``b h t d`` or ``b t h d``), head order and dtype.
CandidateInputs = tuple[Float[Tensor, "b _ _ d"], Float[Tensor, "b _ _ d"], Float[Tensor, "b _ _ dv"]]


def to_candidate(ins: FunctionInputs, keep: KeepMask | None, is_causal: bool, dtype: torch.dtype,
                 conventions: Conventions, device: torch.device | None = None
                 ) -> tuple[CandidateInputs, dict[str, Any]]:
    """Canonical inputs (``bhtd``, ``h = (g r)``, keep-mask) in the candidate's conventions and ``dtype``, on
    ``device`` (None: where they are, the CPU): copies, so that nothing the candidate does to them, during the call
    or after it, reaches the audit's own."""
    q, k, v = (x.to(device=device, dtype=dtype, copy=True) for x in ins)
    keep = None if keep is None else keep.to(device=device, copy=True)
    g = k.shape[1]
    grouped = q.shape[1] != g
    if conventions.grouping == "r g" and q.shape[1] != g:
        q = rearrange(q, "b (g r) t d -> b (r g) t d", g=g)
        if keep is not None and keep.shape[1] > 1:
            keep = rearrange(keep, "b (g r) t s -> b (r g) t s", g=g)
    if conventions.layout == "bthd":
        q, k, v = (rearrange(x, "b h t d -> b t h d") for x in (q, k, v))
    kwargs: dict[str, Any] = {}
    if keep is not None:
        if conventions.mask_kind == "additive":
            kwargs["attn_mask"] = torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, -math.inf)
        else:
            kwargs["attn_mask"] = keep if conventions.mask_polarity == "keep" else ~keep
    if is_causal and conventions.supports_causal:  # an always-causal candidate without the flag: not passed
        kwargs["is_causal"] = True
    if conventions.enable_gqa and grouped:
        kwargs["enable_gqa"] = True  # torch's SDPA refuses g < h without it
    return (q, k, v), kwargs


def from_candidate(out: CandidateOutput, g: int, conventions: Conventions) -> CandidateOutput:
    if conventions.layout == "bthd":
        out = rearrange(out, "b t h d -> b h t d")
    if conventions.grouping == "r g" and out.shape[1] != g:
        out = rearrange(out, "b (r g) t d -> b (g r) t d", g=g)
    return out


def candidate_call(example: Example, conventions: Conventions, device: torch.device | str | None = None
                   ) -> tuple[CandidateInputs, dict[str, Any]]:
    """The positional and keyword arguments the audit passes to the candidate for ``example`` (on ``device``)."""
    return to_candidate(example.inputs(), example.mask(), example.is_causal, example.torch_dtype, conventions,
                        None if device is None else torch.device(device))


candidate_call = typechecked(candidate_call)


def check_signature(candidate: Candidate, conventions: Conventions, name: str) -> None:
    """Raise :class:`AuditUsageError` unless ``candidate(q, k, v, [attn_mask=..., is_causal=...])`` binds."""
    if not callable(candidate):
        raise AuditUsageError(f"{name} is not callable")
    try:
        signature = inspect.signature(candidate)
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return
    kwargs: dict[str, Any] = {}
    if conventions.supports_mask:
        kwargs["attn_mask"] = None
    if conventions.supports_causal:
        kwargs["is_causal"] = False
    if conventions.enable_gqa:
        kwargs["enable_gqa"] = True
    try:
        signature.bind(None, None, None, **kwargs)
    except TypeError as err:
        flags = " (or declare supports_mask=False / supports_causal=False)" if kwargs else ""
        if conventions.enable_gqa and "enable_gqa" in str(err):
            flags = " (enable_gqa=True is passed because enable_gqa is declared)"
        raise AuditUsageError(f"{name}{signature} cannot be called as candidate(q, k, v"
                              f"{''.join(f', {k}=...' for k in kwargs)}): {err}{flags}") from None


def takes_enable_gqa(candidate: Candidate) -> bool:
    """Whether ``candidate`` takes an ``enable_gqa`` keyword (torch's SDPA): a parameter of that name in its
    signature, or, for a builtin without a readable signature, one call on two query heads over one key/value
    head with ``enable_gqa=True`` that returns a tensor (the CLI's ``--gqa`` passes the flag then)."""
    try:
        return "enable_gqa" in inspect.signature(candidate).parameters
    except (TypeError, ValueError):  # a builtin: try it
        pass
    q, k = torch.randn(1, 2, 2, 2, dtype=torch.float64), torch.randn(1, 1, 2, 2, dtype=torch.float64)
    try:
        return isinstance(candidate(q, k, k, enable_gqa=True), Tensor)
    except Exception:
        return False


@shape_checked
@dataclass
class FunctionAdapter:
    """The :class:`~typed_transformer.audit.core.report.Adapter` of a functional candidate in its conventions."""

    candidate: Candidate
    conventions: Conventions
    name: str
    kind: Literal["function", "module"] = "function"
    fixed: dict[str, int] | None = None
    rotary: tuple[float, Literal["half", "interleaved"]] | None = None
    positional: str | None = None
    longest: int | None = None
    #: where the candidate is called (None: the CPU); its inputs move there, its output comes back to the CPU,
    #: where the reference runs
    device: torch.device | None = None
    #: the last call's output and inputs as the candidate had them, each with a copy: re-read after the next call
    previous: list[tuple[str, Tensor, Tensor]] = field(default_factory=list, init=False, repr=False, compare=False)

    __shape_checked__ = ("call", "reference", "logit_bound", "logits", "rows", "decode", "fast_path")

    def call(self, ins: FunctionInputs, keep: KeepMask | None, is_causal: bool, dtype: torch.dtype
             ) -> CandidateOutput:
        args, kwargs = to_candidate(ins, keep, is_causal, dtype, self.conventions, self.device)
        q, k, v = args
        with candidate_code(q=q, k=k, v=v, attn_mask=kwargs.get("attn_mask")):
            out = self.candidate(*args, **kwargs)
        if not isinstance(out, Tensor):
            raise CheckFailure(f"returned {type(out).__name__}, expected a tensor")
        if type(out) is not Tensor:  # a subclass: judged as the plain tensor it holds, its own methods never asked
            note_change(subclass_note(type(out).__name__))
            with torch._C.DisableTorchFunctionSubclass():
                out = out.as_subclass(Tensor)
        self._reread()
        held = {"output": out, "q": q, "k": k, "v": v, "attn_mask": kwargs.get("attn_mask")}
        self.previous = [(name, x, x.detach().clone()) for name, x in held.items() if isinstance(x, Tensor)]
        # copied at once (and back to the CPU): a candidate that writes every call into one output buffer (as CUDA
        # graphs do) would otherwise overwrite the output a check still holds
        return from_candidate(out.to(device="cpu", copy=True), ins[1].shape[1], self.conventions)

    def _reread(self) -> None:
        """The previous call's output and inputs, re-read after this call: one changed since is named in the report
        (the audit holds copies, so no verdict depends on it; a caller that keeps them would see them change)."""
        for name, x, was in self.previous:
            if modified(was, x):
                note_change("its previous output was overwritten by the next call (one output buffer reused, as "
                            "CUDA graphs do: a caller that keeps an output sees it change)" if name == "output" else
                            f"an earlier call's input {name} was changed during a later call (the candidate keeps its "
                            f"inputs and writes into them)")
        self.previous = []

    def reference(self, ins: FunctionInputs, keep: KeepMask | None, is_causal: bool, dtype: torch.dtype
                  ) -> Float[Tensor, "b h t dv"]:
        q, k, v = (x.to(dtype) for x in ins)
        return reference_attention(q, k, v, keep, is_causal=is_causal, conventions=self.conventions)

    def logit_bound(self, ins: FunctionInputs) -> float:
        """The largest ``|q| . |k| * scale`` (how much a logit's rounding error is amplified)."""
        q, k, _ = ins
        scale = self.conventions.scale if self.conventions.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        if not (q.numel() and k.numel()):
            return 1.0
        grouped = rearrange(q.abs(), "b (g r) t d -> b g r t d", g=k.shape[1])
        return float(einsum(grouped, k.abs(), "b g r t d, b g s d -> b g r t s").max()) * abs(scale)

    def logits(self, ins: FunctionInputs) -> Float64[Tensor, "b h t s"]:
        """The float64 logits ``(b, h, t, s)`` of the reference."""
        q, k, _ = ins
        scale = self.conventions.scale if self.conventions.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        grouped = rearrange(q.double(), "b (g r) t d -> b g r t d", g=k.shape[1])
        logits = einsum(grouped, k.double(), "b g r t d, b g s d -> b g r t s") * scale
        return rearrange(logits, "b g r t s -> b (g r) t s")

    def rows(self, keep: KeepMask, example: Example) -> Bool[Tensor, "#b #h #t 1"]:
        return keep.any(dim=-1, keepdim=True)

    def decode(self, ins: FunctionInputs, dtype: torch.dtype) -> CandidateOutput | None:
        return None

    def fast_path(self, x: Float[Tensor, "b t e"], padding: Bool[Tensor, "b t"], dtype: torch.dtype
                  ) -> CandidateOutput | None:
        return None

    def repro(self, example: Example, check: str) -> str:
        """A snippet that runs as printed in a fresh interpreter when the candidate can be imported (from its
        module, or from ``name`` when that is ``pkg.mod:attr``, as the CLI names it): the inputs built plainly
        from their seed, the reference's call, the candidate's call exactly as the audit made it, and the
        difference (of the gradients, for ``gradients``)."""
        line = import_line(self.candidate, "candidate")
        if line is None and ":" in self.name and " " not in self.name:
            module_name, _, attr = self.name.partition(":")
            line = f"import importlib\ncandidate = importlib.import_module({module_name!r}).{attr}"
        if line is None:
            line = f"candidate = ...  # {self.name}: define or import it here (it cannot be imported by name)"
        return function_repro(example, self.conventions, line, check, self.device)


def _reference_call(example: Example, conventions: Conventions) -> tuple[str, str]:
    """The import and the call of the reference on ``q, k, v, keep``: ours when the conventions are the paper's,
    else the audit's public reference in the candidate's conventions."""
    semantic = ("causal_alignment", "scale", "fully_masked", "decode_sees_all", "always_causal")
    changed = {name: getattr(conventions, name) for name in semantic
               if getattr(conventions, name) != getattr(DEFAULT_CONVENTIONS, name)}
    if not changed:
        return ("from typed_transformer import scaled_dot_product_attention",
                f"ref = scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal={example.is_causal})")
    said = ", ".join(f"{name}={value!r}" for name, value in changed.items())
    return ("from typed_transformer.audit import Conventions, reference_attention",
            f"ref = reference_attention(q, k, v, keep, is_causal={example.is_causal}, conventions=Conventions({said}))")


def _candidate_lines(example: Example, conventions: Conventions, inputs: str,
                     device: torch.device | None = None) -> list[str]:
    """The lines that call ``candidate`` on ``inputs`` (canonical q, k, v) as the audit does (its dtype, layout,
    head order, mask kind and polarity, flags, device) and bring its output back to ``(b, h, t, dv)`` as ``out``."""
    dtype = f"torch.{example.dtype}"
    on = "" if device is None or device.type == "cpu" else f", device={str(device)!r}"
    lines = [f"qc, kc, vc = (x.to({dtype}{on}) for x in {inputs})"]
    grouped = example.g != example.h
    mask = "keep"
    if on and example.keep is not None:
        lines.append(f"mask = keep.to(device={str(device)!r})")
        mask = "mask"
    if conventions.grouping == "r g" and grouped:
        lines.append(f"qc = rearrange(qc, 'b (g r) t d -> b (r g) t d', g={example.g})  # head i uses kv head i % g")
        if example.keep is not None and len(example.keep[0]) > 1:
            lines.append(f"mask = rearrange(keep, 'b (g r) t s -> b (r g) t s', g={example.g})")
            mask = "mask"
    if conventions.layout == "bthd":
        lines.append("qc, kc, vc = (x.transpose(1, 2) for x in (qc, kc, vc))  # (b, t, h, d)")
    kwargs = []
    if example.keep is not None:
        if conventions.mask_kind == "additive":
            lines.append(f"additive = torch.zeros({mask}.shape, dtype={dtype}{on}).masked_fill(~{mask}, "
                         f"float('-inf'))")
            kwargs.append("attn_mask=additive")
        else:
            kwargs.append(f"attn_mask={mask}" if conventions.mask_polarity == "keep"
                          else f"attn_mask=~{mask}  # True = masked out")
    if example.is_causal and conventions.supports_causal:
        kwargs.append("is_causal=True")
    if conventions.enable_gqa and grouped:
        kwargs.append("enable_gqa=True")
    comment = ""
    if kwargs and "#" in kwargs[-1]:
        kwargs[-1], comment = kwargs[-1].split("  #")
        comment = "  #" + comment
    lines.append(f"out = candidate({', '.join(['qc', 'kc', 'vc', *kwargs])}){comment}")
    if conventions.layout == "bthd":
        lines.append("out = out.transpose(1, 2)  # back to (b, h, t, dv)")
    if conventions.grouping == "r g" and grouped:
        lines.append(f"out = rearrange(out, 'b (r g) t d -> b (g r) t d', g={example.g})")
    if on:
        lines.append("out = out.cpu()  # compared on the CPU, where the reference runs")
    return lines


def function_repro(example: Example, conventions: Conventions, import_candidate: str, check: str,
                   device: torch.device | None = None) -> str:
    """A plain repro of a function's counterexample (see :meth:`FunctionAdapter.repro`)."""
    amplitude = "" if example.amplitude == 1.0 else f" * {example.amplitude!r}"
    shapes = {"q": (example.b, example.h, example.t, example.d), "k": (example.b, example.g, example.s, example.d),
              "v": (example.b, example.g, example.s, example.dv)}
    reference_import, reference = _reference_call(example, conventions)
    lines = ["import torch", "from einops import rearrange", "from typed_transformer.strategies import randn",
             reference_import, import_candidate, f"# the counterexample (check {check}, {example.dtype})"]
    axes = {"q": "(b, h, t, d)", "k": "(b, g, s, d)", "v": "(b, g, s, dv)"}
    # the keys of a long row grow along it (Example.ramp)
    ramp = "" if not example.ramp else (f" * (1 + {example.ramp!r} * torch.arange({example.s}, dtype=torch.float64)"
                                        f"[:, None] / {max(example.s - 1, 1)})")
    for offset, (name, shape) in enumerate(shapes.items()):
        scaled = {"q": amplitude, "k": amplitude + ramp, "v": f" + {example.shift!r}" if example.shift else ""}[name]
        lines.append(f"{name} = randn({shape}, seed={example.seed + offset}){scaled}  # {axes[name]}, float64")
    lines.append("keep = None" if example.keep is None else
                 f"keep = torch.tensor({example.keep!r})  # True = may attend")
    if example.repeat > 1:  # a kernel of whole blocks: every position repeated (Example.repeat)
        lines.append(f"q, k, v = (x.repeat_interleave({example.repeat}, dim=-2) for x in (q, k, v))  # each position "
                     f"{example.repeat} times")
        if example.keep is not None:
            lines.append(f"keep = keep.repeat_interleave({example.repeat}, dim=-2).repeat_interleave("
                         f"{example.repeat}, dim=-1)")
    if check != "gradients" and example.dtype in ("float16", "bfloat16"):
        lines += _half_lines(example, conventions, reference, check, device)
        return _without_unused_einops(lines)
    if check != "gradients":
        lines += [reference, *_candidate_lines(example, conventions, "(q, k, v)", device),
                  f"print('max error', float((out.double() - ref).abs().max()))  # check {check}"]
        return _without_unused_einops(lines)
    lines += ["ours = [x.clone().requires_grad_(True) for x in (q, k, v)]",
              f"theirs = [x.to(torch.{example.dtype}).requires_grad_(True) for x in (q, k, v)]",
              reference.replace("(q, k, v,", "(*ours,"),
              *_candidate_lines(example, conventions, "theirs", device),
              f"cotangent = randn(tuple(ref.shape), seed={example.seed + 4})  # the gradient of the output",
              "(ref.nan_to_num(0.0) * cotangent).sum().backward()",
              "(out.double().nan_to_num(0.0) * cotangent).sum().backward()",
              "errors = {n: float((b.grad.double() - a.grad).abs().max()) for n, a, b in zip('qkv', ours, theirs)}",
              "print('gradient errors', errors)",
              f"print('max error', max(errors.values()))  # check {check}"]
    return _without_unused_einops(lines)


def _half_lines(example: Example, conventions: Conventions, reference: str, check: str,
                device: torch.device | None = None) -> list[str]:
    """A half-precision repro's lines: what the check compared (the reference on the inputs rounded to the dtype,
    and the bound of ``checks.half_bound`` at the default tolerance of 2), so that the repro prints both numbers."""
    dtype = f"torch.{example.dtype}"
    good = reference.replace("ref = ", "good = ").replace("(q, k, v,", "(q.float(), k.float(), v.float(),")
    lines = [f"q, k, v = (x.to({dtype}).double() for x in (q, k, v))  # rounded to {example.dtype}, as the "
             f"candidate gets them", reference, f"{good}.to({dtype})  # a kernel that accumulates in float32",
             f"base = max(float((good.double() - ref).abs().max()), torch.finfo({dtype}).eps * max(1.0, "
             f"float(ref.abs().max())))"]
    if conventions.half_precision == "plain":
        said = f"conventions=Conventions(**{dataclasses.asdict(conventions)!r})"
        lines += ["from typed_transformer.audit import Conventions, reference_attention",
                  f"plain = reference_attention(*(x.to({dtype}) for x in (q, k, v)), keep, "
                  f"is_causal={example.is_causal}, {said}, softmax_dtype={dtype})  # plain math in {example.dtype}",
                  "base = max(base, float((plain.double() - ref).abs().max()))"]
    return [*lines, *_candidate_lines(example, conventions, "(q, k, v)", device),
            f"print('max error', float((out.double() - ref).abs().max()), 'allowed', 2 * base)  # check {check}"]


def _without_unused_einops(lines: list[str]) -> str:
    """The repro's lines, without the einops import when no line rearranges."""
    if not any("rearrange(" in line for line in lines):
        lines = [line for line in lines if line != "from einops import rearrange"]
    return "\n".join(lines)


def select(checks: Sequence[str] | None, kind: str) -> list[str]:
    """The checks to run (default: every registered check that applies to ``kind``)."""
    known = [name for name, check in REGISTRY.items() if kind in check.kinds]
    selected = known if checks is None else list(checks)
    unknown = [c for c in selected if c not in known]
    if unknown:
        raise ValueError(f"unknown check {unknown[0]!r}; choose from {', '.join(known)}")
    return selected


def run_audit(adapter: Adapter, *, checks: Sequence[str] | None, dtypes: Sequence[torch.dtype] | None,
              max_examples: int, seed: int, tolerance: float, conventions: dict[str, Any],
              budget: Budget | str = "default") -> AuditReport:
    """Run the selected checks on ``adapter``, one report row per check and dtype (``dtypes=None``: float32,
    float64 and each half-precision dtype the candidate accepts, see :func:`default_dtypes`)."""
    with collect_state_changes() as changes:  # the audit's (and its inference's, when it collects them)
        report = _run_audit(adapter, checks, dtypes, max_examples, seed, tolerance, conventions, budget)
    report.state_changes = list(changes)
    return report


def _run_audit(adapter: Adapter, checks: Sequence[str] | None, dtypes: Sequence[torch.dtype] | None,
               max_examples: int, seed: int, tolerance: float, conventions: dict[str, Any],
               budget: Budget | str) -> AuditReport:
    selected = select(checks, adapter.kind)
    plan = resolve_budget(budget)
    if tolerance <= 0 or max_examples <= 0:
        raise ValueError("audit: tolerance and max_examples must be positive")
    refused: list[str] = []
    if dtypes is None:
        dtypes, refused = default_dtypes(adapter, plan)
    bad = [d for d in dtypes if d not in DTYPE_NAMES]
    if bad or not dtypes:
        raise ValueError(f"audit: dtypes must be floating dtypes among {', '.join(DTYPE_NAMES.values())}; got "
                         f"{list(dtypes)}")
    results: list[CheckResult] = []
    for name in selected:
        for dtype in dtypes:
            result = run_check(REGISTRY[name], adapter, dtype, max_examples=max_examples, seed=seed,
                               tolerance=tolerance, budget=plan)
            results.append(result)
            if result.status == "SKIP":  # the reason does not depend on the dtype: one row
                result.dtype = ""
                break
    untested = adapter.conventions.untested() + refused
    if not plan.deep_examples:
        untested.append(f"sizes past 6 keys and 8 features, batches past 3 (budget={plan.name!r})")
    if adapter.longest is not None:
        untested.append(f"sequences longer than {adapter.longest} (the module's longest: its spec's max_length)")
    if adapter.fixed is not None:  # a module: its head counts and sizes are what they are
        untested = [note for note in untested if "supports_gqa" not in note]
        untested.append(f"head counts and sizes other than the module's (h={adapter.fixed['h']}, "
                        f"g={adapter.fixed['g']}, d={adapter.fixed['d']}, dv={adapter.fixed['dv']})")
    return AuditReport(adapter.name, conventions, results, seed, max_examples, [DTYPE_NAMES[d] for d in dtypes],
                       tolerance, environment(getattr(adapter, "device", None)), untested,
                       causes=group(adapter, results, tolerance))


def default_dtypes(adapter: Adapter, budget: Budget) -> tuple[list[torch.dtype], list[str]]:
    """The dtypes a function accepts of float32, float64, float16 and bfloat16 (half precision where the budget's
    ``half_precision`` says so, or where the function refuses both float32 and float64: a half-only kernel is
    audited in its own dtypes): each is probed once (one call on a 2-query, 3-key example with dv = d, lengths
    rounded up to whole blocks; it must return a tensor without raising; d = 4, or the least head size it takes).
    Modules are audited in float32 and float64 only: their reference runs on weights rounded to the dtype, which the
    half-precision rule (inputs rounded, computed in float32) does not model. Returns the dtypes and a "not tested"
    note per dtype left out."""
    if adapter.kind != "function":
        if not budget.half_precision:
            return [torch.float32, torch.float64], [
                f"float16 and bfloat16 (budget={budget.name!r}; dtypes= audits them)"]
        return [torch.float32, torch.float64], [
            "float16 and bfloat16 (a module is audited in float32 and float64 unless dtypes= says)"]
    d = adapter.conventions.head_size(4)
    t, s = adapter.conventions.blocks(2, 3)
    probe = Example(b=1, h=1, g=1, t=t, s=s, d=d, dv=d, seed=0)
    accepted: list[torch.dtype] = []
    refused: dict[torch.dtype, str] = {}
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        try:
            out = adapter.call(probe.inputs(), None, False, dtype)
        except (CandidateRaised, CheckFailure) as err:
            reason = str(err.__cause__ or err).splitlines()[0] if str(err.__cause__ or err) else type(err).__name__
            refused[dtype] = f"{DTYPE_NAMES[dtype]} (the candidate refused it: {reason})"
            continue
        if isinstance(out, Tensor):
            accepted.append(dtype)
    full = [dt for dt in accepted if dt in (torch.float32, torch.float64)]
    if not budget.half_precision and full:
        return full, [refused[dt] for dt in (torch.float32, torch.float64) if dt in refused] + [
            f"float16 and bfloat16 (budget={budget.name!r}; dtypes= audits them)"]
    if not accepted:  # every dtype refused: audited in float32 and float64, where each check names the refusal
        return [torch.float32, torch.float64], []
    return accepted, list(refused.values())


def audit_attention(
    candidate: Candidate,
    *,
    conventions: Conventions | Literal["infer"] = DEFAULT_CONVENTIONS,
    checks: Sequence[str] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    max_examples: int = 20,
    seed: int = 0,
    tolerance: float = 2.0,
    name: str | None = None,
    known: Mapping[str, Any] | None = None,
    budget: Budget | str = "default",
    threads: int | None = 1,
    device: torch.device | str | None = None,
    isolate: bool = False,
) -> AuditReport:
    """Run the attention checks on ``candidate`` (every registered check, or the subset ``checks``), each once
    per dtype.

    Args:
        candidate: ``candidate(q, k, v, *, attn_mask=None, is_causal=False)`` in ``conventions``.
        conventions: the candidate's layout, mask polarity, causal alignment, scale, fully-masked rows and what
            it supports (the audit draws only that, and the report lists what was left out), or ``"infer"``:
            :func:`~typed_transformer.audit.infer_conventions` decides them first, the report opens with them and
            their evidence, and each behaviour that matches no convention is a FAIL of the ``conventions`` row.
            When declared conventions are contradicted by the behaviour, the report names the field and the
            witness.
        checks: names of registered checks (default: all that apply to functions).
        dtypes: the dtypes the inputs are drawn in; each check runs once per dtype (one report row each).
            Default: float32, float64, and float16 and bfloat16 when the candidate accepts them (a refused one is
            listed under "not tested"); half precision is judged against what a kernel accumulating in float32
            achieves on the same rounded inputs (docs/audit.md).
        max_examples: Hypothesis examples per check and dtype (small sizes; the budget adds its deep ones).
        seed: Hypothesis seed; the same seed gives the same examples and the same report.
        tolerance: ``k`` in ``err <= k * reference_error``.
        name: how the report names the candidate (default ``module:qualname``).
        known: with ``conventions="infer"``, the fields you know (``{"causal_alignment": "top-left"}``): inference
            does the rest and checks each known field against the behaviour; a contradiction is a FAIL of the
            ``conventions`` row that names the field, the behaviour and the witness. Constraints on what is drawn
            (``self_attention``, ``head_sizes``, ``lengths``, ``max_length``, ``length_multiple``,
            ``equal_head_sizes``, ``even_head_size``, ``head_size_multiple``, ``supports_autograd``) may be given
            here too.
        budget: ``"default"``: beside the small examples, :class:`Budget`'s deep ones (lengths across the tiles,
            head sizes up to 256, batches and head counts 5 to 16); ``"quick"``: the small examples only; ``"ci"``:
            a few deep sizes for a suite; ``"thorough"``: also 512 to 4096 keys and 32 and 64 heads; or a
            :class:`Budget` of your own.
        threads: torch's intra-op thread count while the audit runs (restored after; default 1, the fastest for
            the audit's small tensors, on a busy machine most of all), or None to leave it as it is.
        device: where the candidate is called (``"cuda"``, ``"cuda:1"``, ``torch.device``; default the CPU). The
            inputs are drawn exactly as on the CPU (same seed, same examples) and moved there; the candidate's
            output and gradients come back to the CPU, where the float64 reference runs. The report records the
            device, its name and the torch and CUDA/ROCm versions.
        isolate: import and call the candidate in its own process (:mod:`.isolation`): an exit, a signal, a
            segfault or a hang of it stops the audit with one line naming it (:class:`CandidateStopped`), and its
            code never runs beside the reference. The candidate must be importable by name (a function defined
            at the top of an importable module). The command line's default for a function.

    Raises:
        AuditUsageError: the candidate's signature does not take the arguments the conventions imply
            (checked before any example runs).
        ValueError: an unknown check name, a non-positive ``tolerance`` or ``max_examples``, ``known`` without
            ``conventions="infer"``, an unknown field or value in ``known``.
    """
    check_trusted()
    label = name or name_of(candidate)
    where = audit_device(device)
    if (isolate or isinstance(candidate, IsolatedCandidate)) and where is not None and where.type != "cpu":
        raise AuditUsageError(f"isolate=True calls the candidate on the CPU only (a forked process cannot use the "
                              f"{where.type} device its parent set up); audit on {where} with isolate=False")
    with audit_threads(threads), collect_state_changes(), _isolated(candidate, isolate) as called:
        return _audit_attention(called, conventions, checks, dtypes, max_examples, seed, tolerance, label, known,
                                budget, where)


@contextmanager
def _isolated(candidate: Candidate, isolate: bool) -> Iterator[Candidate]:
    """``candidate``, or (``isolate``) the same function in its own process for the block."""
    if not isolate or isinstance(candidate, IsolatedCandidate):
        yield candidate
        return
    with IsolatedCandidate(candidate) as isolated:
        yield isolated


def audit_device(device: torch.device | str | None) -> torch.device | None:
    """``device`` as a ``torch.device`` (None: the CPU, where the audit's tensors are); one that does not exist
    here is a ValueError that names it."""
    if device is None:
        return None
    try:
        found = torch.device(device)
        torch.empty(0, device=found)
    except (RuntimeError, TypeError, AssertionError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"device {str(device)!r} is not usable here: {first}") from None
    return found


def _audit_attention(candidate: Candidate, conventions: Conventions | Literal["infer"], checks: Sequence[str] | None,
                     dtypes: Sequence[torch.dtype] | None, max_examples: int, seed: int, tolerance: float,
                     name: str | None, known: Mapping[str, Any] | None, budget: Budget | str,
                     device: torch.device | None = None) -> AuditReport:
    label = name or name_of(candidate)
    select(checks, "function")
    if known is not None and conventions != "infer":
        raise ValueError("known= goes with conventions='infer' (declared conventions already say every field)")
    if conventions == "infer":
        inference = infer_function_conventions(candidate, seed=seed, name=label, device=device, budget=budget,
                                               **(known or {}))
        adapter = FunctionAdapter(candidate, inference.conventions, label, device=device)
        report = run_audit(adapter, checks=checks, dtypes=dtypes, max_examples=max_examples, seed=seed,
                           tolerance=tolerance, conventions=asdict(inference.conventions), budget=budget)
        return with_inference(report, inference)
    check_signature(candidate, conventions, label)
    adapter = FunctionAdapter(candidate, conventions, label, device=device)
    report = run_audit(adapter, checks=checks, dtypes=dtypes, max_examples=max_examples, seed=seed,
                       tolerance=tolerance, conventions=asdict(conventions), budget=budget)
    if not report.passed:
        inferred = infer_function_conventions(candidate, seed=seed, name=label, device=device, budget=budget)
        report.contradictions = contradictions(conventions, inferred)
    return report


def name_of(candidate: object) -> str:
    module = getattr(candidate, "__module__", None)
    qualname = getattr(candidate, "__qualname__", None) or type(candidate).__name__
    return f"{module}:{qualname}" if module else str(qualname)


# ----------------------------------------------------------------------------------------------------
# pytest integration
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditCase:
    """One check of an audit, as a pytest parameter: ``case.run()`` passes, fails or skips the test. With
    ``conventions="infer"`` the candidate's conventions are inferred once per candidate (and ``known``) for every
    case of it, and the ``conventions`` case fails on what inference found."""

    candidate: Candidate
    check: str
    conventions: Conventions | Literal["infer"]
    options: tuple[tuple[str, Any], ...] = ()
    known: tuple[tuple[str, Any], ...] = ()
    threads: int | None = 1

    def run(self) -> list[CheckResult]:
        """Run the check (every dtype); fail the test with the counterexample and repro, or skip it."""
        import pytest

        options = dict(self.options)
        with audit_threads(self.threads), collect_state_changes():
            if self.conventions != "infer":
                report = audit_attention(self.candidate, conventions=self.conventions, checks=[self.check],
                                         threads=None, **options)
            else:
                device = audit_device(options.get("device"))
                inference = _inferred(self.candidate, self.known, options.get("seed", 0), options.get("name"), device,
                                      options.get("budget", "default"))
                if self.check == "conventions":
                    report = with_inference(AuditReport(inference.candidate, asdict(inference.conventions), [],
                                                        options.get("seed", 0), 0, [], 0.0, environment(device)),
                                            inference)
                    undeclared = [d.line() for d in report.differences if not d.declared]
                    if undeclared:
                        pytest.fail("conventions: undeclared differences from the paper's attention (declare each "
                                    "with known= if it is meant):\n" + "\n".join(undeclared), pytrace=False)
                else:
                    label = options.pop("name", None) or name_of(self.candidate)
                    adapter = FunctionAdapter(self.candidate, inference.conventions, label, device=device)
                    report = run_audit(adapter, checks=[self.check], dtypes=options.get("dtypes"),
                                       max_examples=options.get("max_examples", 20), seed=options.get("seed", 0),
                                       tolerance=options.get("tolerance", 2.0),
                                       conventions=asdict(inference.conventions),
                                       budget=options.get("budget", "default"))
        if report.results and all(r.status == "SKIP" for r in report.results):
            pytest.skip(report.results[0].message)
        for result in report.results:
            if result.status == "FAIL":
                where = f" [{result.dtype}]" if result.dtype else ""
                pytest.fail(f"{self.check}{where}: {result.message}\n{result.traceback or ''}\n"
                            f"{result.repro or ''}", pytrace=False)
        return report.results


_INFERRED: dict[tuple[int, tuple[tuple[str, Any], ...], int, str | None, str, str], tuple[Candidate, Inference]] = {}


def _inferred(candidate: Candidate, known: tuple[tuple[str, Any], ...], seed: int, name: str | None,
              device: torch.device | None = None, budget: Budget | str = "default") -> Inference:
    """The conventions inferred for ``candidate`` with ``known``, once per pytest session (every case of a
    candidate shares them; the candidate is held beside its result, so its id is not reused while cached)."""
    key = (id(candidate), known, seed, name, str(device), repr(budget))
    if key not in _INFERRED:
        _INFERRED[key] = (candidate, infer_function_conventions(candidate, seed=seed, name=name, device=device,
                                                                budget=budget, **dict(known)))
    return _INFERRED[key][1]


def parametrize_audit(candidate: Candidate, *, conventions: Conventions | Literal["infer"] = DEFAULT_CONVENTIONS,
                      checks: Sequence[str] | None = None, known: Mapping[str, Any] | None = None,
                      threads: int | None = 1, **options: Any) -> Any:
    """``pytest.mark.parametrize`` over the audit's checks: one test item per check, with the check's name
    as its id::

        @parametrize_audit(my_attention, conventions="infer", budget="quick")
        def test_my_attention(audit_case):
            audit_case.run()

    ``conventions="infer"``: the conventions are inferred once for the candidate (not once per item), ``known``
    fixes the fields you know (as in :func:`audit_attention`, ``half_precision`` among them), and a first item,
    ``conventions``, fails on what inference found (a behaviour that matches no convention, a known field the
    behaviour contradicts). ``threads``: torch's intra-op threads while each item runs (default 1; None leaves
    torch's setting). ``options`` go to :func:`audit_attention` (``dtypes``, ``max_examples``, ``seed``,
    ``tolerance``, ``budget``: ``"quick"`` is the choice for a suite run on every change, ``"default"`` adds the
    deep sizes; ``device``: where the candidate runs). Needs pytest (installed by the ``audit`` extra).
    """
    import pytest

    if known is not None and conventions != "infer":
        raise ValueError("known= goes with conventions='infer' (declared conventions already say every field)")
    if known:
        check_known({k: v for k, v in known.items() if k in INFERRED})
    names = select(checks, "function")
    if conventions == "infer":
        names = ["conventions", *names]
    frozen = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in (known or {}).items()))
    cases = [AuditCase(candidate, check, conventions, tuple(sorted(options.items())), frozen, threads)
             for check in names]
    return pytest.mark.parametrize("audit_case", [pytest.param(case, id=case.check) for case in cases])


def longest_drawn(budget: Budget | str) -> int | None:
    """The longest length ``budget`` draws (its deep lengths'), where inference probes ``max_length``; None for a
    budget of small examples only (the probes' own lengths cover them)."""
    lengths = resolve_budget(budget).lengths
    return max(lengths) if lengths else None


def infer_function_conventions(candidate: Callable[..., Any], *, seed: int = 0, name: str | None = None,
                               device: torch.device | str | None = None, budget: Budget | str = "default",
                               **options: Any) -> Inference:
    """:func:`~typed_transformer.audit.infer_conventions` for a functional candidate: ``options`` are constraints
    on what is drawn (``self_attention``, ``head_sizes``, ...) and fields the user knows (any field inference
    decides: checked against the behaviour, see :func:`~typed_transformer.audit.core.inference.with_known`);
    ``max_length`` is probed up to the longest length ``budget`` draws."""
    fields = {f.name for f in dataclasses.fields(Conventions)}
    strange = sorted(set(options) - fields)
    if strange:
        raise ValueError(f"infer_conventions: {', '.join(strange)} {'is' if len(strange) == 1 else 'are'} not a "
                         f"field of Conventions")
    known = {key: value for key, value in options.items() if key in INFERRED}
    constraints = {key: value for key, value in options.items() if key not in INFERRED}
    check_known(known)
    adapter = FunctionAdapter(candidate, Conventions(**constraints), name or name_of(candidate),
                              device=audit_device(device))
    inference = infer_adapter(adapter, seed=seed, candidate=candidate, longest=longest_drawn(budget))
    return with_differences(with_known(inference, known) if known else inference, known)
