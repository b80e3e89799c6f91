"""One report block per root cause, not one per check.

A failing row's counterexample is replayed in its simplest forms, in its own dtype: no mask and no causal flag
(the plain output), the mask alone, the causal flag alone. The simplest form that still fails with an error of the
same size names the check that explains the row (``reference``, ``masking`` or ``causality``); otherwise the row
explains itself. Rows whose candidate raised the same exception at the same place share one block. Each block
prints one counterexample and its repro, and lists the checks and dtypes it explains.

A module's block is then diagnosed: the reference is recomputed with one change at a time (another logit scale,
a bias left out, the softmax over the query axis, the rotary pairs, which dimensions are rotated, float32 rotary
tables, a float32 softmax, and float32 tables with a float32 softmax together), and the first change under which
the module matches is named. A ``rope`` failure says so: the rotation itself is wrong, or something the rope check
depends on (scale, biases, the softmax's axis or precision) fails elsewhere too.
"""

import copy
import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .checks import half_bound, half_rule
from .examples import Example, bound, error
from .reference import effective_keep
from .report import Adapter, Cause, CheckResult
from .running import CandidateRaised, CheckFailure, Run

#: A row is explained by a simpler replay when its own error ratio is at most this many times the replay's.
_EXPLAINS = 100.0

#: What a block explained by a simpler replay says.
_SUMMARIES = {
    "reference": "the output differs from the reference with no mask and no causal flag",
    "masking": "the mask is applied wrongly (the output differs with the mask alone, no causal flag)",
    "causality": "is_causal=True is applied wrongly (the output differs with the causal flag alone, no mask)",
}


def example_of(row: CheckResult) -> Example | None:
    """The row's counterexample as an :class:`Example` (None when it has none)."""
    if row.counterexample is None:
        return None
    fields = dict(row.counterexample)
    if fields.get("widths") is not None:
        fields["widths"] = tuple(fields["widths"])
    names = {f.name for f in dataclasses.fields(Example)}
    if not set(fields) <= names:
        return None
    return Example(**fields)


def input_size(row: CheckResult) -> float:
    """How many numbers the row's counterexample feeds the candidate (``inf`` without one)."""
    e = example_of(row)
    if e is None:
        return math.inf
    if e.widths is not None:
        eq, ek, ev = e.widths
        return e.b * (e.t * eq + (0 if e.tied else e.s * (ek + ev)))
    return e.b * (e.h * e.t * e.d + e.g * e.s * (e.d + e.dv))


def replay_ratio(adapter: Adapter, example: Example, tolerance: float, *, live_only: bool = False,
                 variant: Adapter | None = None) -> float:
    """The error ratio (error over the reference's own error, as the checks compute it) of the candidate on
    ``example`` against the reference (or ``variant``'s reference); ``inf`` when the candidate raises or returns
    another shape. ``live_only``: rows without an allowed key are left out."""
    reference = variant or adapter
    dtype = example.torch_dtype
    ins, keep, is_causal = example.inputs(), example.mask(), example.is_causal
    try:
        with torch.no_grad():
            out = adapter.call(ins, keep, is_causal, dtype)
    except (CandidateRaised, CheckFailure):
        return math.inf
    rows = None
    eff = effective_keep(keep, is_causal, example.t, example.s, adapter.conventions)
    if eff is not None and (live_only or adapter.conventions.fully_masked == "any"):
        rows = adapter.rows(eff, example)
    run = Run(reference, dtype, tolerance)
    with torch.no_grad():
        if half_rule(run):  # half precision: the bound the checks judged the row by
            ref64, _, base = half_bound(run, ins, keep, is_causal, rows)
        else:
            ref64 = reference.reference(ins, keep, is_causal, torch.float64)
            reflow = reference.reference(ins, keep, is_causal, dtype)
            length = example.s + example.d + (max(example.widths) if example.widths else 0)
            _, base = bound(ref64, reflow, tolerance, dtype, rows=rows, amplification=adapter.logit_bound(ins),
                            length=length)
    if tuple(out.shape) != tuple(ref64.shape):
        return math.inf
    return error(out, ref64, rows) / base


def _explained(row: CheckResult, replay: float, tolerance: float) -> bool:
    """The replay fails, with an error of the row's size (an infinite error only by an infinite one)."""
    if not replay > tolerance:
        return False
    if row.ratio is None:
        return True
    if math.isinf(row.ratio) or math.isnan(row.ratio):
        return math.isinf(replay)
    return row.ratio <= _EXPLAINS * replay


def family(adapter: Adapter, row: CheckResult, tolerance: float) -> str:
    """The key of the row's root cause: ``raised:...`` for an exception of the candidate (its type and where it was
    raised), else the check its simplest failing replay names, else its own check."""
    if row.traceback is not None:
        frames = [line.strip() for line in row.traceback.splitlines() if line.strip().startswith("File ")]
        return f"raised:{row.message.split(':')[0]}:{frames[-1] if frames else ''}"
    example = example_of(row)
    if example is None or row.name not in _REPLAYED:
        return row.name
    plain = dataclasses.replace(example, keep=None, is_causal=False, amplitude=1.0)
    if _explained(row, replay_ratio(adapter, plain, tolerance), tolerance):
        return "reference"
    if example.keep is not None:
        masked = dataclasses.replace(example, is_causal=False, amplitude=1.0)
        if _explained(row, replay_ratio(adapter, masked, tolerance, live_only=True), tolerance):
            return "masking"
    if example.is_causal and adapter.conventions.supports_causal:
        causal = dataclasses.replace(example, keep=None, amplitude=1.0)
        if _explained(row, replay_ratio(adapter, causal, tolerance), tolerance):
            return "causality"
    return row.name


#: Checks whose counterexample is an ordinary call of the candidate (``fast_path`` calls another path; the
#: inferred ``conventions`` row is a finding with its own probe).
_REPLAYED = {"reference", "scale", "causality", "batch_independence", "permutation", "masking", "padding",
             "fully_masked", "mask_and_causal", "large_logits", "gradients", "dtype", "rope", "incremental_decoding"}


def group(adapter: Adapter, results: Sequence[CheckResult], tolerance: float) -> list[Cause]:
    """The failing rows of ``results`` grouped into root causes, in the order of the check that explains each;
    a module's causes diagnosed (and its ``rope`` rows attributed)."""
    order = list(dict.fromkeys(r.name for r in results))
    keyed: dict[str, list[CheckResult]] = {}
    for row in results:
        if row.status == "FAIL" and row.name != "conventions":
            try:
                key = family(adapter, row, tolerance)
            except Exception:  # a replay the adapter cannot make (a spec's own error): the row explains itself
                key = row.name
            keyed.setdefault(key, []).append(row)
    causes = []
    for key, rows in keyed.items():
        check = key if key in order else rows[0].name
        # the smallest input on which the output differs, among the rows of the check that explains them
        shown = min((r for r in rows if r.name == check), key=input_size, default=rows[0])
        if key.startswith("raised:"):
            summary = f"the candidate raises {shown.message.removeprefix('candidate raised ')}"
        else:
            summary = _SUMMARIES.get(key) or (shown.message.splitlines()[0] if shown.message else key)
        causes.append(Cause(check, rows, shown, summary))
    causes.sort(key=lambda c: (input_size(c.shown), order.index(c.check) if c.check in order else len(order),
                               min(results.index(r) for r in c.rows)))  # the smallest counterexample first
    for cause in causes:
        _diagnose(adapter, cause, tolerance)
    return causes


# ----------------------------------------------------------------------------------------------------
# Diagnosis of a module's failure: the reference with one change at a time
# ----------------------------------------------------------------------------------------------------

Variant = tuple[str, str, Callable[[Any], None]]  # (kind: "rotation" | "other" | "precision", description, change)


def _variants(adapter: Any, dtype: torch.dtype) -> list[Variant]:
    """The changes tried, each a description and an in-place change of a copy of the adapter: what the rotation
    depends on first (scale, biases, the softmax's precision), then the rotation itself, then both precisions."""
    variants: list[Variant] = []
    w = adapter.weights
    named = _scale_name(adapter)
    own = f"{w.scale:.4g}" if named == "1/sqrt(d)" else f"{w.scale:.4g} ({named})"
    for scale, what in ((1.0, "1 (no 1/sqrt(d))"), (w.scale ** 2, f"{w.scale ** 2:.4g} ({named} twice)")):
        if not math.isclose(scale, w.scale):
            variants.append(("other", f"the logit scale is {what} instead of {own}",
                             functools.partial(_rescale, scale=scale)))
    for name in ("bq", "bk", "bv", "bo"):
        if getattr(w, name) is not None:
            variants.append(("other", f"the {name[1]} projection's bias is left out",
                             functools.partial(_without, name=name)))
    variants += _convention_variants(adapter)
    variants.append(("other", "its softmax runs over the query axis (each key's column sums to 1) instead of the "
                     "keys", lambda a: setattr(a, "softmax_over_queries", True)))
    if dtype == torch.float64:
        variants.append(("other", "its softmax runs in float32 (float32 precision in a float64 run)",
                         lambda a: setattr(a, "softmax_dtype", torch.float32)))
    if adapter.rotary is None:
        return variants
    base, style = adapter.rotary
    other = "interleaved" if style == "half" else "half"
    pairs = {"half": "(x[i], x[i + d/2])", "interleaved": "(x[2i], x[2i + 1])"}
    variants.append(("rotation", f"it pairs {pairs[other]} where the spec says {pairs[style]}",
                     lambda a: setattr(a, "rotary", (base, other))))
    variants.append(("rotation", "no rotation is applied", lambda a: setattr(a, "rotary", None)))
    if adapter.rotary_dims < w.d:
        variants.append(("rotation", f"it rotates the last {adapter.rotary_dims} of {w.d} dimensions of each head "
                         f"instead of the first", lambda a: setattr(a, "rotary_last", True)))
        variants.append(("rotation", f"it rotates all {w.d} dimensions of each head, where the spec says the first "
                         f"{adapter.rotary_dims}", lambda a: setattr(a, "rotary_dims", w.d)))
    if dtype == torch.float64:
        variants.append(("rotation", "its cos/sin tables are computed in float32 (float32 precision in a float64 "
                         "run)", lambda a: setattr(a, "rotary_tables", torch.float32)))

        def both(a: Any) -> None:
            a.rotary_tables, a.softmax_dtype = torch.float32, torch.float32

        variants.append(("precision", "its cos/sin tables and its softmax are computed in float32 (float32 "
                         "precision in a float64 run)", both))
    return variants


def _convention_variants(adapter: Any) -> list[Variant]:
    """Another documented convention than the spec's: the other key/value head grouping (``.repeat`` in place of
    ``repeat_interleave`` gives ``"r g"``), the other causal alignment."""
    variants: list[Variant] = []
    w, spec = adapter.weights, adapter.spec
    if 1 < w.g < w.h:
        other = "r g" if spec.grouping == "g r" else "g r"
        how = {"g r": "'g r' (head i uses kv head i // r: repeat_interleave)",
               "r g": "'r g' (head i uses kv head i % g: .repeat)"}

        def regroup(a: Any) -> None:  # the module's weights read again under the other grouping
            a.spec = dataclasses.replace(spec, grouping=other)
            a.weights = type(a)(a.original, a.spec, conventions=a.conventions).weights

        variants.append(("other", f"its key/value heads are grouped {how[other]} where the spec says "
                         f"{how[spec.grouping]}: declare grouping={other!r} in the spec if intended", regroup))
    alignment = adapter.conventions.causal_alignment
    flipped = "top-left" if alignment == "bottom-right" else "bottom-right"
    variants.append(("other", f"its causal mask is aligned {flipped} where the spec says {alignment}",
                     lambda a: setattr(a, "conventions", dataclasses.replace(a.conventions,
                                                                             causal_alignment=flipped))))
    return variants


def _scale_name(adapter: Any) -> str:
    """Where the module's logit scale comes from: ``1/sqrt(d)``, the config field it is computed from (Gemma 2's
    ``query_pre_attn_scalar**-0.5``, Granite's ``attention_multiplier``), the module's attribute the spec reads, or
    the spec's number."""
    w, spec = adapter.weights, adapter.spec
    if math.isclose(w.scale, 1 / math.sqrt(w.d)):
        return "1/sqrt(d)"
    config = getattr(adapter.original, "config", None)
    for field, power in (("query_pre_attn_scalar", -0.5), ("attention_multiplier", 1.0)):
        given = getattr(config, field, None)
        if isinstance(given, int | float) and given > 0 and math.isclose(float(given) ** power, w.scale):
            exponent = "" if power == 1.0 else f"**{power:g}"
            return f"config.{field}{exponent} = {given:g}{exponent}"
    if isinstance(spec.scale, str):
        return f"the module's {spec.scale}"
    return "the spec's scale"


def _without(adapter: Any, name: str) -> None:
    adapter.weights = dataclasses.replace(adapter.weights, **{name: None})


def _rescale(adapter: Any, scale: float) -> None:
    adapter.weights = dataclasses.replace(adapter.weights, scale=scale)
    adapter.conventions = dataclasses.replace(adapter.conventions, scale=scale)


def diagnose(adapter: Adapter, example: Example, tolerance: float) -> Variant | None:
    """The first change of the reference under which the module matches on ``example`` (None: no single change
    tried explains it, or the adapter is not a module's)."""
    if adapter.kind != "module" or not hasattr(adapter, "weights"):
        return None
    for variant in _variants(adapter, example.torch_dtype):
        changed = copy.copy(adapter)
        variant[2](changed)
        try:
            ratio = replay_ratio(adapter, example, tolerance, variant=changed)
        except Exception:  # a change this module's spec cannot take: not the explanation
            continue
        if ratio <= tolerance:
            return variant
    return None


def _diagnose(adapter: Adapter, cause: Cause, tolerance: float) -> None:
    """Name what a module's cause is (its diagnosis) and attribute its ``rope`` rows."""
    if adapter.kind != "module" or cause.check.startswith("raised:") or cause.shown.traceback is not None:
        return
    example = example_of(cause.shown)
    if example is None or cause.shown.name not in _REPLAYED - {"incremental_decoding", "gradients"}:
        return
    example = dataclasses.replace(example, amplitude=1.0) if cause.check in _SUMMARIES else example
    found = diagnose(adapter, example, tolerance)
    if found is not None:
        cause.diagnosis = f"the module matches the reference when {found[1]}"
    for row in cause.rows:
        if row.name == "rope":
            attribution = rope_attribution(adapter, row, found, cause, tolerance)
            row.message = f"{row.message}; {attribution}"
            if cause.diagnosis is None and attribution.startswith("the rotation itself"):
                cause.diagnosis = f"rope: {attribution}"


def rope_attribution(adapter: Adapter, row: CheckResult, found: Variant | None, cause: Cause,
                     tolerance: float) -> str:
    """What a failing ``rope`` row is due to: the rotation itself, or what the rope check depends on."""
    example = example_of(row)
    if example is not None and (cause.shown is not row):
        found = diagnose(adapter, example, tolerance) or found
    if found is None:
        shifted = None if example is None else shift_dependence(adapter, example, tolerance)
        if shifted is not None:
            return (f"the rotation itself: it makes the logits depend on absolute positions, which a rotary "
                    f"embedding never does ({shifted})")
        return ("the rotation or something it depends on: no single change tried (scale, biases, float32 softmax, "
                "pairs, rotated dimensions, float32 tables) explains it")
    kind, what, _ = found
    if kind == "rotation":
        return f"the rotation itself: {what}"
    others = list(dict.fromkeys(r.name for r in cause.rows if r.name != "rope"))
    elsewhere = f" ({', '.join(others)} fail{'s' if len(others) == 1 else ''} the same way)" if others else ""
    if kind == "precision":
        return f"not a wrong rotation: {what}{elsewhere}"
    return f"not the rotation: {what}, which the rope check depends on{elsewhere}"


def shift_dependence(adapter: Adapter, example: Example, tolerance: float) -> str | None:
    """A rotary embedding makes the logits depend on relative positions only: the same tokens one position later,
    after a padded (masked-out) token, must give the same outputs. What changed when they do not (None when they
    do, or when the module takes no key padding mask or more than one input)."""
    fixed = adapter.fixed or {}
    if not (fixed.get("tied") and adapter.conventions.supports_mask):
        return None
    dtype = example.torch_dtype
    x = example.inputs()[0]
    b, t = x.shape[0], x.shape[1]
    later = torch.cat([x[:, :1], x], dim=1)
    keep = torch.ones(b, 1, 1, t + 1, dtype=torch.bool)
    keep[..., 0] = False
    try:
        with torch.no_grad():
            out = adapter.call((x, x, x), None, example.is_causal, dtype)
            moved = adapter.call((later, later, later), keep, example.is_causal, dtype)[:, 1:]
    except Exception:  # the candidate (or its spec) cannot take the longer, padded input: no evidence
        return None
    with torch.no_grad():
        ref = adapter.reference((x, x, x), None, example.is_causal, dtype)
        ref_moved = adapter.reference((later, later, later), keep, example.is_causal, dtype)[:, 1:]
        ref64 = adapter.reference((x, x, x), None, example.is_causal, torch.float64)
    length = example.s + example.d + (max(example.widths) if example.widths else 0)
    _, base = bound(ref64, ref, tolerance, dtype, amplification=adapter.logit_bound((x, x, x)), length=length)
    allowed = 10 * tolerance * max(base, error(ref_moved, ref))
    moved_by = error(moved, out)
    if moved_by <= allowed:
        return None
    return (f"t={t}: the same tokens one position later, after a padded token, change the outputs by "
            f"{moved_by:.3g} > {allowed:.3g}")
