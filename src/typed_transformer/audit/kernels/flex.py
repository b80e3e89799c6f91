"""FlexAttention (``torch.nn.attention.flex_attention``) audited with zero lines: its ``score_mod`` and
``mask_mod`` read from what they do and matched to a variant of the paper's attention that the reference computes
with its own code,

    O = softmax_j( score_mod(s q_i . k_j, b, h, i, j)  where mask_mod(b, h, i, j), else -inf ) V

(``s`` the call's ``scale``, ``1/sqrt(d)`` by default; ``i`` and ``j`` flex's indices, each counted from 0).

The audit does not read the mods' code. It calls ``flex_attention`` with them on probes (eager, float64) whose
values are the identity (``dv = s``), so that the output is the attention weights, and it reads three things:

* the keys each query keeps (``mask_mod``, and a ``score_mod`` that returns -inf): every key, causal, a causal
  sliding window of ``w`` keys (the query and the ``w - 1`` keys before it, ``i - w < j <= i``, Mistral's and
  Hugging Face's), a two-sided window of radius ``r`` (``|i - j| <= r``, LongT5's), documents (``doc[i] ==
  doc[j]``) or causal documents, and, with fewer queries than keys, whether query ``i`` sits at position ``i``
  (top-left) or ``i + s - t`` (bottom-right: ours);
* the bias on a zero logit (every query zero): none, or ALiBi, one slope per head, linear in ``j`` (BLOOM's form)
  or in ``-|i - j|`` (the paper's);
* the transform of one growing logit (one query against a zero key and a key at logit ``x``): the scale, then
  either nothing or a tanh soft-cap ``c tanh(l / c)`` of the scaled logit (Gemma 2's).

Three standards make a mod wrong with zero lines. ALiBi's slopes must be the paper's for the head count
(interpolated when it is not a power of two). A number the mod closes over whose name says what it is must be what
the mod computes: a window (``WINDOW = 4``: 4 keys), a cap (``SOFTCAP = 50``: logits saturate at 50), a head size
(``HEAD_DIM``: the size probed). The scale must be ``1/sqrt(d)`` unless declared. Each is a row of the report:
``mask_mod``, ``score_mod``; then ``reference`` (random inputs against the reference of the variant found, in
float64 and float32), ``compiled`` (``torch.compile(flex_attention)`` against the reference, with
``compiled=True``) and ``gradients`` (where flex has a backward: not on the CPU).

Axis names as everywhere: ``b`` batch, ``h`` heads, ``t`` queries, ``s`` keys, ``d`` head size.
"""

import dataclasses
import functools
import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ...positions import alibi_slopes
from ...shapecheck import typechecked
from ..core.conventions import Conventions
from ..core.examples import bound, error, import_line
from ..core.reference import reference_attention
from ..core.report import PAPER, AuditReport, CheckResult, Difference, environment
from ..core.running import audit_threads

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
MaskName = Literal["none", "causal", "window", "two-sided window", "documents", "causal documents"]

#: what ``known=`` may declare for a FlexAttention audit (each a number or alignment the mods should compute)
FLEX_KNOWN = ("window", "softcap", "scale", "causal_alignment", "head_size")
#: the longest and the most heads a probe tries (a mod reading a table of its own is audited inside it)
_LONGEST, _MOST_HEADS = 32, 64
#: what a number's name must contain to be read as the window, the cap or the head size the mod was written for
_NAMED = {"window": ("window",), "softcap": ("cap",), "head_size": ("head_dim", "head_size", "headdim"),
          "heads": ("heads", "n_head", "num_head")}


@dataclass(frozen=True)
class FlexVariant:
    """What the mods were read to compute (see the module docstring); the reference computes it with its own code.
    ``window``: the keys a causal window keeps, or a two-sided window's radius; ``documents``: each position's
    document; ``alignment``: where query ``i`` sits when ``t < s`` (None: not decided, ``t = s`` only); ``alibi``:
    ALiBi's form (``"key"``: ``m j``; ``"distance"``: ``-m |i - j|``) with the paper's slopes for ``heads``;
    ``softcap``: ``c`` of ``c tanh(l / c)``; ``scale``: None for ``1/sqrt(d)``; ``heads``/``length``: the head
    count and the longest length the mods take (a table of their own), None for any."""

    mask: MaskName = "none"
    window: int | None = None
    documents: tuple[int, ...] | None = None
    alignment: Literal["top-left", "bottom-right"] | None = None
    alibi: Literal["key", "distance"] | None = None
    softcap: float | None = None
    scale: float | None = None
    heads: int | None = None
    length: int | None = None


@dataclass
class _Audit:
    """The mods, the call's arguments, and what was read so far (evidence lines and findings by row)."""

    score_mod: ScoreMod | None
    mask_mod: MaskMod | None
    scale: float | None
    known: dict[str, Any]
    device: torch.device
    named: dict[str, float] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    findings: dict[str, list[str]] = field(default_factory=lambda: {"mask_mod": [], "score_mod": []})
    differences: list[Difference] = field(default_factory=list)
    untested: list[str] = field(default_factory=list)
    probes: int = 0

    def flex(self, q: Tensor, k: Tensor, v: Tensor, compiled: bool = False) -> Tensor:
        """flex_attention with the mods on ``q (b, h, t, d)``, ``k (b, h, s, d)``, ``v (b, h, s, dv)``, on the
        audit's device, the output back on the CPU."""
        from torch.nn.attention.flex_attention import create_block_mask

        self.probes += 1
        b, h, t, _ = q.shape
        s = k.shape[2]
        where = str(self.device)
        block_mask = None if self.mask_mod is None else create_block_mask(self.mask_mod, b, h, t, s, device=where)
        call = _flex_function(compiled)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager flex warns that it is unfused
            out = call(q.to(self.device), k.to(self.device), v.to(self.device), score_mod=self.score_mod,
                       block_mask=block_mask, scale=self.scale)
        assert isinstance(out, Tensor)
        return out.to("cpu")

    def weights(self, q: Tensor, k: Tensor) -> Float[Tensor, "h t s"]:
        """The attention weights of batch 0 (values the identity: the output is the weights)."""
        s = k.shape[2]
        v = torch.eye(s, dtype=q.dtype).expand(q.shape[0], q.shape[1], s, s)
        return self.flex(q, k, v.contiguous())[0]

    def zero_weights(self, h: int, t: int, s: int, d: int = 4) -> Float[Tensor, "h t s"]:
        """The weights when every logit is zero: what the mask and the bias alone do."""
        return self.weights(torch.zeros(1, h, t, d, dtype=torch.float64), torch.zeros(1, h, s, d, dtype=torch.float64))


@dataclass(frozen=True)
class FlexDifference(Difference):
    """A :class:`Difference` declared with ``audit_flex``'s ``known=`` (there is no command line for mods)."""

    def declaration(self) -> str:
        return f"known={{{self.field!r}: {self.value!r}}}"


@functools.cache
def _flex_function(compiled: bool) -> Callable[..., Any]:
    """``flex_attention``, or its ``torch.compile`` (compiled once per process, then once per new size)."""
    from torch.nn.attention.flex_attention import flex_attention

    eager: Callable[..., Any] = flex_attention  # torch types it as a bare "function", which a conditional keeps
    return torch.compile(eager) if compiled else eager


# ----------------------------------------------------------------------------------------------------
# Numbers the mods close over
# ----------------------------------------------------------------------------------------------------


def closed_over(fn: Callable[..., Any] | None) -> dict[str, float]:
    """The numbers ``fn`` reads by name: its closure cells, the module globals its code names, its defaults and a
    ``functools.partial``'s keywords (``{"WINDOW": 4}``). Bools are not numbers here."""
    bound_keywords: dict[str, float] = {}  # a partial's keywords win over what the function reads itself
    while isinstance(fn, functools.partial):
        bound_keywords = {k: float(v) for k, v in fn.keywords.items() if _number(v)} | bound_keywords
        fn = fn.func
    found: dict[str, float] = {}
    code = getattr(fn, "__code__", None)
    if fn is None or code is None:
        return bound_keywords
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or (), strict=False):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if _number(value):
            found[name] = float(value)
    module_globals = getattr(fn, "__globals__", {})
    found |= {name: float(module_globals[name]) for name in code.co_names
              if name in module_globals and _number(module_globals[name])}
    signature_defaults = getattr(fn, "__kwdefaults__", None) or {}
    found |= {name: float(value) for name, value in signature_defaults.items() if _number(value)}
    return found | bound_keywords


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _named(a: _Audit, what: str) -> tuple[str, float] | None:
    """The declared (``known``) or closed-over number for ``what`` (window, softcap, head_size, heads), with its
    source."""
    if what in a.known:
        return f"known={{{what!r}: {a.known[what]!r}}}", float(a.known[what])
    for name, value in a.named.items():
        if any(part in name.lower() for part in _NAMED[what]):
            return name, value
    return None


# ----------------------------------------------------------------------------------------------------
# What the mods take: head counts and lengths
# ----------------------------------------------------------------------------------------------------


def _largest(a: _Audit, most: int, probe: Callable[[int], object]) -> tuple[int, str] | None:
    """The largest ``n <= most`` that ``probe(n)`` runs at (and how ``n + 1`` failed), or None when every ``n``
    runs. A mod that reads a table of its own (6 ALiBi slopes, 16 document ids) fails past it."""
    try:
        probe(most)
        return None
    except Exception as err:
        failure = f"{most} raise {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    for n in range(most - 1, 0, -1):
        try:
            probe(n)
        except Exception as err:
            failure = f"{n} raise {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            continue
        return n, failure
    raise ValueError(f"audit_flex: the mods raise at every size down to 1 ({failure})")


def _sizes(a: _Audit) -> tuple[int | None, int]:
    """The head count the mods are written for (None: any) and the longest length probed."""
    heads = None
    if "heads" in a.known:
        heads = int(a.known["heads"])
    else:
        limit = _largest(a, _MOST_HEADS, lambda n: a.zero_weights(n, 2, 2))
        named = _named(a, "heads")
        if limit is not None:
            heads = limit[0]
            a.evidence.append(f"heads = {heads}: the mods take up to {heads} heads ({limit[1]}): audited at {heads}")
        elif named is not None:
            heads = int(named[1])
            a.evidence.append(f"heads = {heads}: the mods read {named[0]} = {heads}: audited at {heads}")
    limit = _largest(a, _LONGEST, lambda n: a.zero_weights(heads or 2, n, n))
    length = _LONGEST if limit is None else limit[0]
    if limit is not None:
        a.evidence.append(f"length <= {length}: the mods take sequences up to {length} ({limit[1]})")
        a.untested.append(f"lengths past {length} (the mods refuse them)")
    window = _named(a, "window")
    if limit is None and window is not None and window[1] + 8 > length:
        length = int(window[1]) + 8  # wide enough to see the window end
    return heads, length


# ----------------------------------------------------------------------------------------------------
# The keys kept: mask_mod
# ----------------------------------------------------------------------------------------------------


def variant_keep(variant: FlexVariant, t: int, s: int) -> Bool[Tensor, "t s"]:
    """The keys each of ``t`` queries keeps of ``s`` in ``variant``, computed by the reference's own rule (query
    ``i`` at position ``i + s - t`` when bottom-right aligned, at ``i`` otherwise)."""
    offset = s - t if variant.alignment == "bottom-right" else 0
    p = torch.arange(t)[:, None] + offset
    j = torch.arange(s)[None, :]
    if variant.mask == "none":
        return torch.ones(t, s, dtype=torch.bool)
    causal = j <= p
    if variant.mask == "causal":
        return causal
    if variant.mask == "window":
        return causal & (p - j < (variant.window or 0))
    if variant.mask == "two-sided window":
        return (p - j).abs() <= (variant.window or 0)
    ids = torch.tensor(variant.documents or ())
    same = ids[p.clamp(max=len(ids) - 1)] == ids[j.clamp(max=len(ids) - 1)]
    return same & causal if variant.mask == "causal documents" else same


variant_keep = typechecked(variant_keep)


def classify_keep(keep: Bool[Tensor, "n n"]) -> FlexVariant | None:
    """The variant whose keys are ``keep`` at ``t = s = n``, or None when none is."""
    n = keep.shape[0]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    candidates = [FlexVariant("none"), FlexVariant("causal")]
    if bool(keep.diagonal().all()):
        width = int(keep.sum(-1).max())
        candidates.append(FlexVariant("window", window=width))
        candidates.append(FlexVariant("two-sided window", window=int((i - j)[keep].abs().max())))
        starts = torch.cat([torch.tensor([True]), ~keep[torch.arange(1, n), torch.arange(n - 1)]])
        ids = tuple(int(x) for x in starts.cumsum(0) - 1)
        if ids[-1] > 0:
            candidates += [FlexVariant("documents", documents=ids), FlexVariant("causal documents", documents=ids)]
    return next((c for c in candidates if torch.equal(variant_keep(c, n, n), keep)), None)


classify_keep = typechecked(classify_keep)


def _mask(a: _Audit, heads: int | None, n: int) -> FlexVariant:
    """The keys kept at ``t = s = n`` (one pattern for every head), then with ``t < s``: the alignment."""
    h = heads or 3
    kept = a.zero_weights(h, n, n) > 0
    if not all(torch.equal(kept[0], kept[x]) for x in range(h)):
        a.findings["mask_mod"].append("the keys kept differ between heads: the reference has one mask for every head")
    variant = classify_keep(kept[0])
    if variant is None:
        a.findings["mask_mod"].append(_unmatched(kept[0]))
        return FlexVariant(heads=heads, length=n)
    variant = dataclasses.replace(variant, heads=heads, length=n)
    a.evidence.append(f"mask = {_describe_mask(variant)}: the keys kept at t = s = {n}")
    window = _named(a, "window")
    if variant.mask in ("causal", "window", "two-sided window"):
        variant = _alignment(a, variant, h, n)
    elif variant.mask != "none":
        a.untested.append("t != s (each position's document is read at its own index)")
    if variant.mask == "window" and window is not None and variant.window != window[1]:
        a.findings["mask_mod"].append(_window_finding(variant, window))
        variant = dataclasses.replace(variant, window=int(window[1]))  # the reference keeps what the name says
    return variant


def _unmatched(kept: Tensor) -> str:
    rows = "; ".join(f"query {i}: keys {[int(j) for j in kept[i].nonzero()]}" for i in range(min(4, len(kept))))
    return (f"the keys kept at t = s = {len(kept)} are none of every key, causal, a sliding window, a two-sided window "
            f"or documents ({rows}, ...)")


def _describe_mask(v: FlexVariant) -> str:
    if v.mask == "window":
        return f"a causal sliding window of {v.window} keys (i - {v.window} < j <= i)"
    if v.mask == "two-sided window":
        return f"a two-sided window of radius {v.window} (|i - j| <= {v.window})"
    if v.mask in ("documents", "causal documents"):
        docs = v.documents or ()
        spans = ", ".join(f"[{docs.index(x)}, {len(docs) - docs[::-1].index(x)})" for x in sorted(set(docs)))
        return f"{v.mask} {spans}"
    return {"none": "every key", "causal": "causal (j <= i)"}[v.mask]


def _window_finding(variant: FlexVariant, window: tuple[str, float]) -> str:
    name, value = window
    off = f"off by {int(variant.window or 0) - int(value):+d}: " if abs((variant.window or 0) - value) <= 2 else ""
    return (f"window: {off}the mod reads {name} = {value:g}, but each query keeps {variant.window} keys (itself and "
            f"the {int(variant.window or 0) - 1} before it); a window of {value:g} keys is i - {value:g} < j <= i "
            f"(Mistral's, Hugging Face's and the reference's)")


def _alignment(a: _Audit, variant: FlexVariant, h: int, n: int) -> FlexVariant:
    """Where a query sits with ``t = n // 2`` queries and ``s = n`` keys: top-left (flex's ``q_idx`` counts from
    0) or bottom-right. Top-left differs from the paper's bottom-right (a KV cache's queries are the last ones)."""
    t = max(1, n // 2)
    kept = a.zero_weights(h, t, n)[0] > 0
    for alignment in ("bottom-right", "top-left"):
        aligned = dataclasses.replace(variant, alignment=alignment)
        if torch.equal(variant_keep(aligned, t, n), kept):
            break
    else:
        a.findings["mask_mod"].append(f"with t = {t} queries and s = {n} keys the keys kept match neither alignment")
        return variant
    said = a.known.get("causal_alignment")
    if said is not None and said != alignment:
        a.findings["mask_mod"].append(f"causal_alignment: declared {said!r}, but with t = {t}, s = {n} query i "
                                      f"keeps keys as {alignment} aligned")
    a.evidence.append(f"causal_alignment = {alignment!r}: with t = {t}, s = {n} query i sits at position "
                      f"{'i + s - t' if alignment == 'bottom-right' else 'i (flex counts q_idx from 0)'}")
    if alignment == "top-left":
        a.differences.append(FlexDifference("causal_alignment", alignment, PAPER["causal_alignment"][1],
                                            f"t = {t}, s = {n}: query i keeps keys j <= i", said == alignment))
    return aligned


# ----------------------------------------------------------------------------------------------------
# The bias and the transform: score_mod
# ----------------------------------------------------------------------------------------------------


def _bias(a: _Audit, variant: FlexVariant) -> FlexVariant:
    """ALiBi or no bias, from the log-weights of zero logits (row-centred over the kept keys)."""
    h, n = variant.heads or 3, variant.length or _LONGEST
    weights = a.zero_weights(h, n, n)
    kept = weights > 0
    logs = weights.clamp_min(1e-300).log().masked_fill(~kept, 0.0)
    centred = _centred(logs, kept)
    if float(centred.abs().max()) < 1e-9:
        return variant
    i, j = torch.arange(n)[:, None].double(), torch.arange(n)[None, :].double()
    for form, feature in (("distance", -(i - j).abs()), ("key", j.expand(n, n))):
        x = _centred(feature.expand(h, n, n).masked_fill(~kept, 0.0), kept)
        slopes = (centred * x).sum((-1, -2)) / (x * x).sum((-1, -2)).clamp_min(1e-300)
        if float((centred - slopes[:, None, None] * x).abs().max()) < 1e-7 * max(1.0, float(centred.abs().max())):
            _slopes(a, slopes, form)
            return dataclasses.replace(variant, alibi=form, heads=h)  # type: ignore[arg-type]
    row = int(centred.abs().amax((0, 2)).argmax())
    a.findings["score_mod"].append(
        f"a bias on zero logits that is neither none nor ALiBi's (linear in the key or in the distance, one slope per "
        f"head): head 0, query {row}: {[round(float(x), 4) for x in centred[0, row, : min(n, 6)]]} (row-centred)")
    return variant


def _centred(x: Tensor, kept: Tensor) -> Tensor:
    count = kept.sum(-1, keepdim=True).clamp_min(1)
    return (x - x.sum(-1, keepdim=True) / count).masked_fill(~kept, 0.0)


def _slopes(a: _Audit, slopes: Tensor, form: str) -> None:
    h = len(slopes)
    paper = alibi_slopes(h)
    shown = ", ".join(f"{float(x):.4g}" for x in slopes[:8])
    a.evidence.append(f"bias = ALiBi ({form} form), slopes {shown}{', ...' if h > 8 else ''} for {h} heads")
    if torch.allclose(slopes, paper, rtol=1e-6, atol=0.0):
        return
    power = torch.tensor([2.0 ** (-8.0 * x / h) for x in range(1, h + 1)], dtype=torch.float64)
    why = (f": 2^(-8 i / {h}) is the paper's rule for a power of two only; for {h} heads it takes the "
           f"{2 ** math.floor(math.log2(h))} slopes of {2 ** math.floor(math.log2(h))} heads, then every other slope "
           f"of {2 ** (math.floor(math.log2(h)) + 1)}" if torch.allclose(slopes, power, rtol=1e-6) else "")
    first = int((slopes - paper).abs().argmax())
    a.findings["score_mod"].append(
        f"alibi: the slopes are not the paper's for {h} heads{why} (head {first}: {float(slopes[first]):.6g}, the "
        f"paper's {float(paper[first]):.6g}; the paper's: {', '.join(f'{float(x):.4g}' for x in paper[:8])})")


def _transform(a: _Audit, variant: FlexVariant, d: int) -> tuple[float, float | None] | str:
    """The logit transform at head size ``d``: ``(scale, cap)`` (cap None: none) of ``c tanh(scale x / c)``, or a
    description of what matched neither."""
    h, n = variant.heads or 3, variant.length or 2
    zeros = a.zero_weights(h, n, n, d)[0]
    row, (j0, j1) = _two_keys(zeros > 0, n)  # the keys the mods keep, matched to a variant or not
    targets = (1e-4, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 400.0)
    nominal = a.scale if a.scale is not None else d**-0.5
    zero = zeros[row]
    base = math.log(float(zero[j1]) / float(zero[j0]))
    seen = []
    for target in targets:
        q = torch.zeros(1, h, n, d, dtype=torch.float64)
        k = torch.zeros(1, h, n, d, dtype=torch.float64)
        q[:, :, row, 0] = target / nominal
        k[:, :, j1, 0] = 1.0
        w = a.weights(q, k)[0, row]
        if not float(w[j0]) > 0.0 < float(w[j1]):  # one weight underflowed: the logits grow past float64's range
            break
        seen.append(math.log(float(w[j1]) / float(w[j0])) - base)
    xs = [target / nominal for target in targets][: len(seen)]
    scale = seen[0] / xs[0]
    if all(abs(g - scale * x) <= 1e-7 * max(1.0, abs(scale * x)) for g, x in zip(seen, xs, strict=True)):
        return scale, None
    cap = _fit_cap(seen, xs, scale)
    if cap is not None:
        return scale, cap
    return (f"a transform of the logits that is neither a scale nor a tanh soft-cap: a logit of "
            f"{xs[5] * nominal:g} becomes {seen[5]:.6g}, one of {xs[-1] * nominal:g} becomes {seen[-1]:.6g}")


def _two_keys(keep: Bool[Tensor, "t s"], n: int) -> tuple[int, tuple[int, int]]:
    """A query row with two kept keys (the last such row), and its first and last kept key."""
    for row in range(n - 1, -1, -1):
        keys = [int(j) for j in keep[row].nonzero()]
        if len(keys) >= 2:
            return row, (keys[0], keys[-1])
    raise ValueError("audit_flex: no query keeps two keys, so the score_mod's transform cannot be read")


def _fit_cap(seen: list[float], xs: list[float], scale: float) -> float | None:
    """``c`` with ``g(x) = c tanh(scale x / c)`` at every probe (bisection where the cap bends the logit most
    clearly), or None."""
    mid = next((i for i, (g, x) in enumerate(zip(seen, xs, strict=True)) if 0.1 < g / (scale * x) < 0.95), None)
    if mid is None:
        return None
    low, high = seen[mid], seen[mid] * 1e6
    for _ in range(200):
        c = (low + high) / 2
        if c * math.tanh(scale * xs[mid] / c) < seen[mid]:
            low = c
        else:
            high = c
    c = (low + high) / 2
    fits = all(abs(g - c * math.tanh(scale * x / c)) <= 1e-6 * max(1.0, abs(g)) for g, x in zip(seen, xs, strict=True))
    return c if fits else None


def _score(a: _Audit, variant: FlexVariant, sizes: tuple[int, ...]) -> FlexVariant:
    """The scale (``1/sqrt(d)`` or one constant, from two head sizes) and the cap, checked against the named cap."""
    read = {d: _transform(a, variant, d) for d in sizes}
    bad = next((r for r in read.values() if isinstance(r, str)), None)
    if bad is not None:
        a.findings["score_mod"].append(bad)
        return variant
    scales = {d: _snap(a, r[0], d) for d, r in read.items() if not isinstance(r, str)}
    caps = {d: r[1] for d, r in read.items() if not isinstance(r, str)}
    shown = ", ".join(f"{s:.4g} at d={d}" for d, s in scales.items())
    if all(math.isclose(s, d**-0.5, rel_tol=1e-6) for d, s in scales.items()):
        scale, scale_text = None, f"{shown}: 1/sqrt(d)"
    elif len(set(round(s, 9) for s in scales.values())) == 1:
        scale, scale_text = next(iter(scales.values())), f"{shown}: one constant"
    else:
        a.findings["score_mod"].append(f"scale: logits scaled by {shown}: neither 1/sqrt(d) nor one constant")
        return variant
    a.evidence.append(f"scale = {scale if scale is None else round(scale, 9)!r}: {scale_text}")
    _declared_scale(a, scale, shown)
    cap = next(iter(caps.values()))
    if cap is not None and any(c is None or not math.isclose(c, cap, rel_tol=1e-5) for c in caps.values()):
        a.findings["score_mod"].append(f"softcap: the cap depends on the head size ({caps})")
    if cap is not None:
        a.evidence.append(f"softcap = {cap:.6g}: scaled logits become {cap:.6g} tanh(l / {cap:.6g})")
    named = _named(a, "softcap")
    if named is not None and (cap is None or not math.isclose(cap, named[1], rel_tol=1e-5)):
        a.findings["score_mod"].append(_cap_finding(named, cap, next(iter(scales.values()))))
    return dataclasses.replace(variant, scale=scale, softcap=cap if named is None else named[1])


def _snap(a: _Audit, scale: float, d: int) -> float:
    """A scale read from a logit of 1e-4 (good to about 1e-9) replaced by the call's, the declared one or
    ``1/sqrt(d)`` when it is that to 1e-6."""
    for exact in (a.scale, a.known.get("scale"), d**-0.5):
        if exact is not None and math.isclose(scale, exact, rel_tol=1e-6):
            return float(exact)
    return scale


def _declared_scale(a: _Audit, scale: float | None, shown: str) -> None:
    said = a.known.get("scale")
    if said is not None and (scale is None or not math.isclose(said, scale, rel_tol=1e-6)):
        a.findings["score_mod"].append(f"scale: declared {said!r}, but the logits are scaled by {shown}")
    elif scale is not None:
        a.differences.append(FlexDifference("scale", round(scale, 9), PAPER["scale"][1], shown,
                                        said is not None))


def _cap_finding(named: tuple[str, float], cap: float | None, scale: float) -> str:
    name, value = named
    if cap is None:
        return f"softcap: the mod reads {name} = {value:g}, but no logit is capped"
    if math.isclose(cap, value * scale, rel_tol=1e-5):
        return (f"softcap: the soft-cap runs before the scale: logits saturate at {cap:.6g} = {value:g} x "
                f"{scale:.6g} (the scale), not at {name} = {value:g}; Gemma 2 caps the scaled logits, "
                f"c tanh(s q.k / c)")
    return f"softcap: the mod reads {name} = {value:g}, but logits saturate at {cap:.6g}"


# ----------------------------------------------------------------------------------------------------
# The checks against the reference
# ----------------------------------------------------------------------------------------------------


def flex_reference(variant: FlexVariant, q: Float[Tensor, "b h t d"], k: Float[Tensor, "b h s d"],
                   v: Float[Tensor, "b h s dv"]) -> Float[Tensor, "b h t dv"]:
    """The reference's attention for ``variant``, in ``q``'s dtype: its own keep-mask, ALiBi with the paper's
    slopes, the cap, the scale (see :func:`~typed_transformer.audit.reference_attention`)."""
    h, t, s = q.shape[1], q.shape[2], k.shape[2]
    keep = None if variant.mask == "none" else variant_keep(variant, t, s)[None, None]
    bias = None
    if variant.alibi is not None:
        offset = s - t if variant.alignment == "bottom-right" else 0
        p = torch.arange(t, dtype=torch.float64)[:, None] + offset
        j = torch.arange(s, dtype=torch.float64)[None, :]
        feature = j.expand(t, s) if variant.alibi == "key" else -(p - j).abs()
        bias = (alibi_slopes(h)[:, None, None] * feature)[None]
    return reference_attention(q, k, v, keep, conventions=Conventions(scale=variant.scale), bias=bias,
                               softcap=variant.softcap)


flex_reference = typechecked(flex_reference)


def _examples(variant: FlexVariant, sizes: tuple[int, ...], seed: int) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Float64 inputs at every head count (the mods' own, or 1, 2, 3, 6, 8, 12), lengths 1 to the longest (t < s
    too when the alignment is decided), batches 1 and 2, head sizes ``sizes``, values of another width."""
    n = variant.length or _LONGEST
    heads = (variant.heads,) if variant.heads else (1, 2, 3, 6, 8, 12)
    lengths = sorted({(x, x) for x in (1, 2, 5, n // 2, n) if x >= 1})
    if variant.alignment is not None:
        lengths += [(max(1, n // 4), n), (1, n)]
    generator = torch.Generator().manual_seed(seed)
    out = []
    for index, (h, (t, s)) in enumerate((h, ts) for h in heads for ts in lengths):
        b, d = 1 + index % 2, sizes[index % len(sizes)]
        out.append(tuple(torch.randn(shape, generator=generator, dtype=torch.float64)
                         for shape in ((b, h, t, d), (b, h, s, d), (b, h, s, 3 + index % 3))))
    return out  # type: ignore[return-value]


def _compare(a: _Audit, variant: FlexVariant, examples: list[tuple[Tensor, Tensor, Tensor]], dtype: torch.dtype,
             tolerance: float, name: str, compiled: bool = False) -> CheckResult:
    worst = 0.0
    for q, k, v in examples:
        ref64 = flex_reference(variant, q, k, v)
        reflow = flex_reference(variant, q.to(dtype), k.to(dtype), v.to(dtype))
        out = a.flex(q.to(dtype), k.to(dtype), v.to(dtype), compiled=compiled)
        scale = variant.scale if variant.scale is not None else q.shape[3] ** -0.5
        largest = float(q.norm(dim=-1).max() * k.norm(dim=-1).max()) * scale  # a logit's rounding, amplified
        allowed, base = bound(ref64, reflow, tolerance, dtype, amplification=largest, length=k.shape[2] + q.shape[3])
        err = error(out, ref64)
        if not err <= allowed:
            b, h, t, d = q.shape
            return CheckResult(name, "FAIL", _dtype_name(dtype), err / base,
                               f"b={b}, h={h}, t={t}, s={k.shape[2]}, d={d}: max error {err:.3g} > allowed "
                               f"{allowed:.3g} against the reference of {_describe_variant(variant)}",
                               {"b": b, "h": h, "t": t, "s": k.shape[2], "d": d, "dv": v.shape[3]},
                               examples=len(examples))
        worst = max(worst, err / base)
    return CheckResult(name, "PASS", _dtype_name(dtype), worst, examples=len(examples))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _describe_variant(v: FlexVariant) -> str:
    parts = [_describe_mask(v)]
    if v.alibi:
        parts.append(f"ALiBi ({v.alibi} form, the paper's slopes)")
    if v.softcap is not None:
        parts.append(f"soft-cap {v.softcap:g}")
    parts.append("scale 1/sqrt(d)" if v.scale is None else f"scale {v.scale:g}")
    return ", ".join(parts)


def _gradients(a: _Audit, variant: FlexVariant, example: tuple[Tensor, Tensor, Tensor], tolerance: float
               ) -> CheckResult:
    """Gradients against the reference's in float64 (float32 on the device), or a SKIP where flex has none."""
    leaves = [x.detach().clone().requires_grad_(True) for x in example]
    try:
        torch.autograd.backward([a.flex(leaves[0], leaves[1], leaves[2]).sum()])
    except (NotImplementedError, RuntimeError) as refused:
        first = str(refused).splitlines()[0] if str(refused) else type(refused).__name__
        a.untested.append(f"gradients (flex_attention refused its backward on {a.device}: {first})")
        return CheckResult("gradients", "SKIP", message=f"no backward on {a.device}")
    ours = [x.detach().clone().requires_grad_(True) for x in example]
    torch.autograd.backward([flex_reference(variant, ours[0], ours[1], ours[2]).sum()])
    worst = 0.0
    for name, theirs, mine in zip("qkv", leaves, ours, strict=True):
        assert theirs.grad is not None
        assert mine.grad is not None
        err = error(theirs.grad, mine.grad)
        # a float64 floor: 16 units in the last place, times the longest sum (s + d) of the example
        base = 16 * torch.finfo(torch.float64).eps * max(1.0, float(mine.grad.abs().max())) * (
            example[1].shape[2] + example[0].shape[3])
        if not err <= tolerance * base:
            return CheckResult("gradients", "FAIL", "float64", err / base, f"d{name}: max error {err:.3g}")
        worst = max(worst, err / base)
    return CheckResult("gradients", "PASS", "float64", worst, examples=1)


# ----------------------------------------------------------------------------------------------------
# The audit
# ----------------------------------------------------------------------------------------------------


def audit_flex(score_mod: ScoreMod | None = None, mask_mod: MaskMod | None = None, *, scale: float | None = None,
               known: Mapping[str, Any] | None = None, compiled: bool = False, device: torch.device | str = "cpu",
               seed: int = 0, tolerance: float = 2.0, name: str | None = None) -> AuditReport:
    """Audit FlexAttention with ``score_mod`` and ``mask_mod`` (either may be None) against the reference's own
    variant of what they compute, with zero lines (see the module docstring).

    Args:
        score_mod: ``score_mod(score, b, h, q_idx, kv_idx) -> score``, as ``flex_attention`` takes it.
        mask_mod: ``mask_mod(b, h, q_idx, kv_idx) -> bool``; the audit builds its block masks.
        scale: the ``scale`` passed to ``flex_attention`` (None: its default, ``1/sqrt(d)``).
        known: what you intended, where the mods cannot say it by a name they close over: ``window`` (keys a
            query keeps), ``softcap``, ``scale`` (the effective one), ``causal_alignment`` (``"top-left"``
            declares flex's ``q_idx``-from-0 causal mask), ``head_size`` (the one size probed), ``heads``.
        compiled: also run ``torch.compile(flex_attention)`` against the reference (a ``compiled`` row).
        device: where flex runs; the reference runs on the CPU in float64.
        seed: the inputs of the ``reference`` row.
        tolerance: ``k`` in ``err <= k * reference_error``.
        name: how the report names the candidate (default the mods' names).

    Raises:
        ValueError: a key of ``known`` outside :data:`FLEX_KNOWN` (and ``heads``), or mods that raise at every
            size.
    """
    unknown = sorted(set(known or {}) - {*FLEX_KNOWN, "heads"})
    if unknown:
        raise ValueError(f"audit_flex: known takes {', '.join((*FLEX_KNOWN, 'heads'))}; got {', '.join(unknown)}")
    start = time.perf_counter()
    a = _Audit(score_mod, mask_mod, scale, dict(known or {}), torch.device(device))
    a.named = closed_over(score_mod) | closed_over(mask_mod)
    with audit_threads(1):
        return _audit(a, compiled, seed, tolerance, name or _name(score_mod, mask_mod), start)


def _audit(a: _Audit, compiled: bool, seed: int, tolerance: float, name: str, start: float) -> AuditReport:
    """Read the mods (sizes, mask, bias, transform), then the rows against the reference."""
    heads, length = _sizes(a)
    variant = _mask(a, heads, length)
    if a.score_mod is not None:
        variant = _bias(a, variant)
    head_size = _named(a, "head_size")
    sizes = (int(head_size[1]),) if head_size is not None else (4, 16)
    if head_size is not None:
        a.evidence.append(f"head size {sizes[0]} ({head_size[0]}): the only size probed")
        a.untested.append(f"head sizes other than {sizes[0]} ({head_size[0]})")
    variant = _score(a, variant, sizes)
    inferred = time.perf_counter() - start
    examples = _examples(variant, sizes, seed)
    results, probes = [_mod_row(a, row, variant) for row in a.findings], a.probes
    results += [_compare(a, variant, examples, dtype, tolerance, "reference") for dtype in (torch.float64,
                                                                                            torch.float32)]
    if compiled:
        results.append(_compare(a, variant, examples[-2:], torch.float32, tolerance, "compiled", compiled=True))
    results.append(_gradients(a, variant, examples[-1], tolerance))
    evidence = [f"inferred from {probes} flex_attention calls ({inferred:.2g} s):",
                *(f"  {e}" for e in a.evidence)]
    if a.differences:
        undeclared = sum(not d.declared for d in a.differences)
        evidence = [f"differences from the paper's attention ({len(a.differences)}, {undeclared} not declared"
                    f"{': the audit does not pass until they are' if undeclared else ''}):",
                    *(f"  - {d.line()}" for d in a.differences), *evidence]
    return AuditReport(name, dataclasses.asdict(variant), results, seed, len(examples), ["float64", "float32"],
                       tolerance, environment(a.device), a.untested, evidence, differences=a.differences)


def _mod_row(a: _Audit, row: str, variant: FlexVariant) -> CheckResult:
    """``mask_mod`` or ``score_mod``: FAIL with its findings, SKIP without the mod (and, for the mask, without a
    score_mod that masks), else PASS with what was read."""
    found = a.findings[row]
    if found:
        return CheckResult(row, "FAIL", message="; ".join(found), examples=a.probes,
                           counterexample={"h": variant.heads or 3, "t": variant.length, "s": variant.length},
                           repro=_repro(a))
    absent = a.score_mod is None if row == "score_mod" else a.mask_mod is None and variant.mask == "none"
    if absent:
        return CheckResult(row, "SKIP", message=f"no {row}")
    what = (_describe_mask(variant) if row == "mask_mod" else
            ", ".join(x for x in (f"ALiBi ({variant.alibi} form)" if variant.alibi else "",
                                  f"soft-cap {variant.softcap:g}" if variant.softcap is not None else "",
                                  "scale 1/sqrt(d)" if variant.scale is None else f"scale {variant.scale:g}") if x))
    return CheckResult(row, "PASS", message=what, examples=a.probes)


def _repro(a: _Audit) -> str | None:
    """A script that reruns the audit in a fresh interpreter, or None when a mod cannot be imported by name."""
    lines = ["from typed_transformer.audit import audit_flex"]
    arguments = []
    for argument, mod in (("score_mod", a.score_mod), ("mask_mod", a.mask_mod)):
        if mod is None:
            continue
        line = import_line(mod, argument)
        if line is None:
            return None
        lines.append(line)
        arguments.append(f"{argument}={argument}")
    arguments += [f"scale={a.scale!r}"] if a.scale is not None else []
    arguments += [f"known={a.known!r}"] if a.known else []
    return "\n".join([*lines, f"print(audit_flex({', '.join(arguments)}).table())"])


def _name(*mods: Callable[..., Any] | None) -> str:
    named = [getattr(m, "__name__", type(m).__name__) for m in mods if m is not None]
    return "flex_attention(" + ", ".join(named) + ")" if named else "flex_attention"


def flex_sdpa(q: Float[Tensor, "b h t d"], k: Float[Tensor, "b g s d"], v: Float[Tensor, "b g s dv"], *,
              attn_mask: Bool[Tensor, "#b #h #t s"] | None = None, is_causal: bool = False,
              enable_gqa: bool = False) -> Float[Tensor, "b h t dv"]:
    """``flex_attention`` behind :func:`torch.nn.functional.scaled_dot_product_attention`'s call, so that the
    function audit (``audit_attention(flex_sdpa, conventions="infer")``) can draw its masks: ``attn_mask`` (True =
    may attend) and ``is_causal`` (bottom-right, ours) become one ``mask_mod`` over the block mask. Eager;
    :func:`flex_sdpa_compiled` runs ``torch.compile(flex_attention)``."""
    return _flex_sdpa(q, k, v, attn_mask, is_causal, enable_gqa, compiled=False)


def flex_sdpa_compiled(q: Float[Tensor, "b h t d"], k: Float[Tensor, "b g s d"], v: Float[Tensor, "b g s dv"], *,
                       attn_mask: Bool[Tensor, "#b #h #t s"] | None = None, is_causal: bool = False,
                       enable_gqa: bool = False) -> Float[Tensor, "b h t dv"]:
    """:func:`flex_sdpa` with ``torch.compile(flex_attention)`` (each new size compiles once)."""
    return _flex_sdpa(q, k, v, attn_mask, is_causal, enable_gqa, compiled=True)


def _flex_sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool, enable_gqa: bool,
               compiled: bool) -> Tensor:
    from torch.nn.attention.flex_attention import create_block_mask

    b, h, t, _ = q.shape
    s = k.shape[2]
    keep = torch.ones(b, h, t, s, dtype=torch.bool, device=q.device)
    if attn_mask is not None:
        keep = keep & attn_mask.to(q.device)
    if is_causal:
        keep = keep & torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)

    def mask_mod(bi: Tensor, hi: Tensor, qi: Tensor, ki: Tensor) -> Tensor:
        return keep[bi, hi, qi, ki]

    block_mask = create_block_mask(mask_mod, b, h, t, s, device=str(q.device))
    call = _flex_function(compiled)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex warns that it is unfused
        out = call(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)
    assert isinstance(out, Tensor)
    return out


flex_sdpa = typechecked(flex_sdpa)
flex_sdpa_compiled = typechecked(flex_sdpa_compiled)
