"""The audit's shared pieces: conventions, examples, the reference, the tolerance rule, the report, the check
registry and the machinery that runs one check as a Hypothesis test."""

import dataclasses
import importlib.metadata
import json
import math
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Literal, Protocol, TypeAlias

import torch
from einops import einsum, rearrange
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from jaxtyping import Bool, Float, Float64, Shaped
from torch import Tensor

from ..attention import scaled_dot_product_attention
from ..masks import causal_mask
from ..shapecheck import shape_checked, typechecked
from ..strategies import randn

Status: TypeAlias = Literal["PASS", "FAIL", "SKIP"]
#: A function candidate's inputs (float64): ``q (b, h, t, d)``, ``k (b, g, s, d)``, ``v (b, g, s, dv)``.
FunctionInputs: TypeAlias = tuple[Float[Tensor, "b h t d"], Float[Tensor, "b g s d"], Float[Tensor, "b g s dv"]]
#: A module candidate's inputs (float64): ``x (b, t, eq)``, ``key (b, s, ek)``, ``value (b, s, ev)``.
ModuleInputs: TypeAlias = tuple[Float[Tensor, "b t eq"], Float[Tensor, "b s ek"], Float[Tensor, "b s ev"]]
Inputs: TypeAlias = FunctionInputs | ModuleInputs
#: A canonical keep-mask (True = may attend); ``b``, ``h`` and ``t`` may be 1 to broadcast.
KeepMask: TypeAlias = Bool[Tensor, "#b #h #t s"]
#: What a candidate returned: its shape and dtype are what the checks compare, so any tensor is accepted here.
CandidateOutput: TypeAlias = Shaped[Tensor, "..."]
#: The reference's output: a function's ``(b, h, t, dv)``, a module's ``(b, t, e)``.
ReferenceOutput: TypeAlias = Float[Tensor, "b h t dv"] | Float[Tensor, "b t e"]
#: The rows a check compares: a function's ``(#b, #h, #t, 1)``, a module's ``(b, t, 1)``.
Rows: TypeAlias = Bool[Tensor, "#b #h #t 1"] | Bool[Tensor, "b t 1"]

#: Version of the check lists: a passing audit keeps its meaning when checks are added.
#: 2: audit_multihead gained causality and gradients. 3: modules through specs; large_logits, mask_and_causal,
#: rope, incremental_decoding, fast_path; per-head masks in masking; masks in gradients; per-dtype rows.
#: 4: a "conventions" row (inferred conventions' findings and undeclared differences FAIL it); large_logits sinks a
#: row's only allowed logit; single queries in causality; padding drops query positions; declared length ranges hold
#: in every check; gradients not compared through rows without keys where NaN is allowed; modules' reference models
#: q/k norms, sliding windows, partial and scaled rotary, position biases, soft-capping, sinks, output gates, sub-norms.
CHECKS_VERSION = "4"

_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)
DTYPE_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
               torch.bfloat16: "bfloat16"}
DTYPES_BY_NAME = {v: k for k, v in DTYPE_NAMES.items()}


class AuditUsageError(ValueError):
    """The candidate cannot be audited as declared (wrong signature, a module that does not match its spec);
    raised before any check runs. The CLI turns it into one line on stderr and exit status 2."""


@dataclass(frozen=True)
class Conventions:
    """What the candidate's arguments mean and what it supports (see the package docstring). Defaults are ours.

    Declarations that narrow what the audit draws (each listed in the report under "not tested"):
    ``self_attention`` (t = s; a module gets one input), ``equal_head_sizes`` (dv = d), ``even_head_size``,
    ``head_sizes`` and ``lengths`` (inclusive ranges), ``mask_kind="additive"`` (masks passed as float
    0/-inf), ``per_head_masks=False`` (only ``(b, 1, t, s)`` masks), ``mask_with_causal=False`` (never both
    ``attn_mask`` and ``is_causal``). ``grouping`` is how query heads map onto key/value heads: ``"g r"``
    (head ``i`` uses kv head ``i // r``, torch's) or ``"r g"`` (``i % g``). ``decode_sees_all``: with
    ``is_causal`` a single query (t = 1) sees every key, whatever ``causal_alignment`` says. ``always_causal``:
    the candidate applies its causal mask whatever it is told (nanoGPT's attention): it is audited on causal
    examples only, every reference is causal. ``enable_gqa``: the candidate takes fewer key/value heads only when
    told so with ``enable_gqa=True`` (torch's ``F.scaled_dot_product_attention``); the audit passes it on every
    call with ``g < h`` (needs ``supports_gqa=True``; ``Conventions.torch_sdpa(gqa=True)`` sets both).
    """

    # Fields with "help" are the audit command's flags (the command line generates them from this metadata).
    layout: Literal["bhtd", "bthd"] = field(default="bhtd", metadata={
        "help": "axis order of the candidate's q, k, v: (batch, heads, time, dim) (default, SDPA's) or (batch, time, "
                "heads, dim)"})
    mask_polarity: Literal["keep", "drop"] = field(default="keep", metadata={
        "help": "keep: True = may attend (SDPA); drop: True = masked out (nn.MultiheadAttention)"})
    causal_alignment: Literal["top-left", "bottom-right"] = field(default="bottom-right", metadata={
        "help": "what is_causal means when t != s (SDPA: top-left)"})
    scale: float | None = field(default=None, metadata={"help": "logit scale (default 1/sqrt(d))", "positive": True})
    fully_masked: Literal["zero", "nan", "uniform", "any"] = field(default="zero", metadata={
        "help": "declared output of query rows without keys (default zero, as in the API; a module: its spec's)"})
    supports_mask: bool = field(default=True, metadata={
        "help": "the candidate takes no attn_mask", "flag": "no_mask", "store": False})
    supports_causal: bool = field(default=True, metadata={
        "help": "the candidate takes no is_causal", "flag": "no_causal", "store": False})
    supports_gqa: bool = field(default=False, metadata={
        "help": "the candidate takes fewer key/value heads (enable_gqa=True is passed with them when it takes that "
                "keyword, as torch's scaled_dot_product_attention does)", "flag": "gqa", "store": True})
    supports_autograd: bool = field(default=True, metadata={
        "help": "skip the gradient check", "flag": "no_autograd", "store": False})
    self_attention: bool = field(default=False, metadata={"help": "the candidate needs t = s", "store": True})
    equal_head_sizes: bool = field(default=False, metadata={"help": "the candidate needs dv = d", "store": True})
    even_head_size: bool = field(default=False, metadata={
        "help": "the candidate needs an even head size", "store": True})
    head_sizes: tuple[int, int] = (1, 8)
    lengths: tuple[int, int] = (1, 6)
    grouping: Literal["g r", "r g"] = field(default="g r", metadata={
        "help": "query head i uses kv head i // r ('g r', torch's) or i %% g ('r g')"})
    mask_kind: Literal["bool", "additive"] = field(default="bool", metadata={
        "help": "additive: the candidate takes float 0/-inf masks only"})
    per_head_masks: bool = True
    mask_with_causal: bool = field(default=True, metadata={
        "help": "the candidate refuses attn_mask and is_causal together", "flag": "no_mask_with_causal",
        "store": False})
    decode_sees_all: bool = field(default=False, metadata={
        "help": "with is_causal a single query sees every key (Hugging Face's sdpa rule)", "store": True})
    always_causal: bool = False
    enable_gqa: bool = False

    def __post_init__(self) -> None:
        for name, allowed in (("layout", ("bhtd", "bthd")), ("mask_polarity", ("keep", "drop")),
                              ("causal_alignment", ("top-left", "bottom-right")),
                              ("fully_masked", ("zero", "nan", "uniform", "any")), ("grouping", ("g r", "r g")),
                              ("mask_kind", ("bool", "additive"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"Conventions: {name} must be one of {', '.join(allowed)}; "
                                 f"got {getattr(self, name)!r}")
        for name in ("head_sizes", "lengths"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"Conventions: {name} must be (low, high) with 1 <= low <= high; got {(low, high)}")
        if self.enable_gqa and not self.supports_gqa:
            raise ValueError("Conventions: enable_gqa=True passes enable_gqa=True to calls with fewer key/value heads "
                             "than query heads; declare supports_gqa=True too (or Conventions.torch_sdpa(gqa=True))")
        if self.even_head_size and self.head_sizes[1] < 2:
            raise ValueError("Conventions: even_head_size needs head_sizes up to at least 2")

    @classmethod
    def typed_transformer(cls) -> "Conventions":
        """:func:`typed_transformer.scaled_dot_product_attention`'s conventions."""
        return cls(supports_gqa=True)

    @classmethod
    def torch_sdpa(cls, *, gqa: bool = False) -> "Conventions":
        """``torch.nn.functional.scaled_dot_product_attention``: top-left causal, refuses ``attn_mask`` with
        ``is_causal=True``, and fully masked rows give NaN or 0 depending on the kernel (not checked). ``gqa``:
        audit grouped-query attention too, passing ``enable_gqa=True`` when ``g < h``."""
        return cls(causal_alignment="top-left", fully_masked="any", mask_with_causal=False, supports_gqa=gqa,
                   enable_gqa=gqa)

    def untested(self) -> list[str]:
        """What the audit does not draw because of a declaration (listed in the report)."""
        notes = []
        if self.self_attention:
            notes.append("t != s and separate key/value inputs (self_attention=True)")
        if self.equal_head_sizes:
            notes.append("dv != d (equal_head_sizes=True)")
        if self.even_head_size:
            notes.append("odd head sizes (even_head_size=True)")
        if self.head_sizes != (1, 8):
            notes.append(f"head sizes outside {self.head_sizes[0]}..{self.head_sizes[1]} (head_sizes)")
        if self.lengths != (1, 6):
            notes.append(f"lengths outside {self.lengths[0]}..{self.lengths[1]} (lengths)")
        if not self.supports_gqa:
            notes.append("grouped-query attention, g < h (supports_gqa=False)")
        if self.mask_kind == "additive":
            notes.append("boolean masks (mask_kind='additive': masks passed as 0/-inf floats)")
        if not self.supports_mask:
            notes.append("attention masks (supports_mask=False)")
        elif not self.per_head_masks:
            notes.append("per-head (b, h, t, s) masks (per_head_masks=False)")
        if not self.supports_causal:
            notes.append("is_causal (supports_causal=False)")
        elif not self.mask_with_causal:
            notes.append("attn_mask and is_causal together (mask_with_causal=False)")
        if self.always_causal:
            notes.append("non-causal attention (always_causal=True: the candidate applies its causal mask whatever "
                         "it is told, so every example is audited as causal)")
        if self.decode_sees_all:
            notes.append("causal alignment of a single query (decode_sees_all=True)")
        if self.fully_masked == "any":
            notes.append("fully masked query rows (fully_masked='any')")
        if self.fully_masked in ("nan", "any", "uniform") and self.supports_autograd:
            notes.append(f"gradients through fully masked rows (fully_masked={self.fully_masked!r}: such a row has "
                         f"no gradient to compare)")
        if not self.supports_autograd:
            notes.append("gradients (supports_autograd=False)")
        return notes


# ----------------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------------


def causal_keep(t: int, s: int, conventions: Conventions) -> Bool[Tensor, "t s"]:
    """The candidate's causal keep-mask: bottom-right (ours) or top-left, all True for one query with
    ``decode_sees_all``."""
    if t == 1 and conventions.decode_sees_all:
        return torch.ones(t, s, dtype=torch.bool)
    if conventions.causal_alignment == "bottom-right":
        return causal_mask(t, s)
    return torch.ones(t, s, dtype=torch.bool).tril()


def effective_keep(keep: KeepMask | None, is_causal: bool, t: int, s: int, conventions: Conventions
                   ) -> KeepMask | None:
    """``keep`` ANDed with the candidate's causal mask, ``(#b, #h, t, s)`` (None when neither is given)."""
    if not is_causal and not conventions.always_causal:
        return keep
    causal = rearrange(causal_keep(t, s, conventions), "t s -> 1 1 t s")
    return causal if keep is None else keep & causal


def reference_attention(
    q: Float[Tensor, "b h t d"],
    k: Float[Tensor, "b g s d"],
    v: Float[Tensor, "b g s dv"],
    keep: Bool[Tensor, "#b #h #t s"] | None = None,
    *,
    is_causal: bool = False,
    conventions: Conventions = Conventions(),
    bias: Float[Tensor, "#b #h #t s"] | None = None,
    softcap: float | None = None,
    sinks: Float[Tensor, " h"] | None = None,
    softmax_dtype: torch.dtype | None = None,
) -> Float[Tensor, "b h t dv"]:
    """Our reference in the candidate's semantics (canonical ``bhtd`` layout with ``h = (g r)``, keep-mask
    ``keep``), computed in the dtype of ``q``. A query row without any allowed key gives what the conventions
    declare: zeros (``"zero"`` and ``"any"``), NaN, or the mean of the values (``"uniform"``). ``bias``: an
    additive position bias on the scaled logits (T5's relative bias, ALiBi), the attention core's ``attn_bias``.
    ``softcap``: Gemma 2's logit soft-capping, ``c * tanh(l / c)`` on the scaled logits before the bias and the
    mask; ``sinks``: gpt-oss's learned per-head logits, one more term in each row's softmax denominator that takes
    no value (``exp(l_j) / (exp(z_h) + sum_i exp(l_i))``); ``softmax_dtype``: the softmax alone in that dtype (a
    variant the diagnosis of a failure tries). With any of the three the reference writes the softmax out."""
    t, s = q.shape[2], k.shape[2]
    keep = effective_keep(keep, is_causal, t, s, conventions)
    dead: Tensor | None = None
    if keep is not None and conventions.fully_masked in ("nan", "uniform"):
        dead = ~keep.any(dim=-1, keepdim=True)  # (#b, #h, t, 1)
        if conventions.fully_masked == "uniform" and bool(dead.any()):
            # equal logits on every key of a dead row: zero its query, let it see every key
            dead_rows = dead.expand(q.shape[0], q.shape[1], t, 1)
            q = q.masked_fill(dead_rows, 0.0)
            keep = keep | dead
            if bias is not None:  # a fill of finfo.min swamps the bias: the row is uniform
                bias = bias.masked_fill(dead_rows, 0.0)
    if softcap is None and sinks is None and softmax_dtype is None:
        out = scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=conventions.scale,
                                           attn_bias=None if bias is None else bias.to(q.dtype))
        assert isinstance(out, Tensor)
    else:
        out = _written_out(q, k, v, keep, conventions.scale, bias, softcap, sinks, softmax_dtype or q.dtype)
    if dead is not None and conventions.fully_masked == "nan":
        out = out.masked_fill(dead.expand(out.shape[0], out.shape[1], t, 1), math.nan)
    return out


def _written_out(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, scale: float | None, bias: Tensor | None,
                 softcap: float | None, sinks: Tensor | None, softmax_dtype: torch.dtype) -> Tensor:
    """The attention of :func:`reference_attention` with its softmax written out (the variants need it): logits
    ``s q.k``, soft-capped, plus the bias, masked to -inf, a sink column appended to each row's softmax and
    dropped after it; ``(b, h, t, dv)`` in ``q``'s dtype. A row whose keys are all masked gives zeros (or, with a
    sink, the sink takes all its weight: zeros too)."""
    r = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
    logits = einsum(q, k, "b h t d, b h s d -> b h t s") * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if bias is not None:
        logits = logits + bias.to(logits.dtype)
    if keep is not None:
        logits = logits.masked_fill(~keep, -math.inf)
    if sinks is not None:
        column = sinks.to(logits.dtype)[None, :, None, None].expand(*logits.shape[:-1], 1)
        logits = torch.cat([logits, column], dim=-1)
    weights = logits.softmax(dim=-1, dtype=softmax_dtype).nan_to_num(0.0).to(q.dtype)  # a row all -inf: zeros
    if sinks is not None:
        weights = weights[..., :-1]
    return einsum(weights, v, "b h t s, b h s dv -> b h t dv")


reference_attention = typechecked(reference_attention)
effective_keep = typechecked(effective_keep)

#: The default conventions (ours).
DEFAULT_CONVENTIONS = Conventions()


def rotate(x: Float[Tensor, "b h t d"], base: float, style: Literal["half", "interleaved"], offset: int = 0, *,
           tables: torch.dtype = torch.float64, frequencies: Float[Tensor, " i"] | None = None,
           magnitude: float = 1.0, positions: Float64[Tensor, "t i"] | None = None) -> Float[Tensor, "b h t d"]:
    """The reference rotary embedding of ``x (b, h, t, d)`` at positions ``offset + j``: pairs
    ``(x[i], x[i + d/2])`` (``"half"``, GPT-NeoX / Llama) or ``(x[2i], x[2i + 1])`` (``"interleaved"``, GPT-J,
    the RoFormer paper), angle ``pos * base^(-2i/d)``; computed in float64, returned in ``x``'s dtype. Written out
    here, not with :class:`~typed_transformer.RotaryEmbedding`, so that it stays independent of the code it audits.
    ``tables``: the dtype of the angles and their cos/sin (float32: the tables most libraries build whatever the
    input dtype, computed as they compute them: ``1 / base^(2i/d)``, times the position, in that dtype).
    ``frequencies`` (``d/2`` of them) replace ``base^(-2i/d)`` and ``magnitude`` multiplies cos and sin: a rope
    type other than the default (Llama 3's, YaRN's), its frequencies read from the module's own rotary class.
    ``positions`` ``(t, d/2)``: the position each frequency of each token turns by, in place of ``offset + j``
    (M-RoPE: each frequency section reads its own axis of 3-D positions)."""
    half = x.shape[-1] // 2
    if frequencies is not None and frequencies.shape != (half,):
        raise AuditUsageError(f"rotate: {tuple(frequencies.shape)} frequencies for {x.shape[-1]} rotated features "
                              f"(expected {half})")
    if tables == torch.float64:
        steps = torch.arange(offset, offset + x.shape[2], dtype=torch.float64)
        inverse = (base ** (-torch.arange(half, dtype=torch.float64) / half) if frequencies is None
                   else frequencies.double())
        theta = (einsum(steps, inverse, "t, i -> t i") if positions is None
                 else positions * inverse[None, :])
    else:
        inverse = (1.0 / (base ** (torch.arange(0, 2 * half, 2, dtype=torch.int64).to(tables) / (2 * half)))
                   if frequencies is None else frequencies.to(tables))
        steps = torch.arange(offset, offset + x.shape[2], dtype=torch.int64).to(tables)
        theta = (steps[:, None] if positions is None else positions.to(tables)) * inverse[None, :]
    y = x.double()
    if style == "interleaved":
        first, second = y[..., 0::2], y[..., 1::2]
    else:
        first, second = y[..., :half], y[..., half:]
    cos, sin = theta.cos().double() * magnitude, theta.sin().double() * magnitude
    a, b = first * cos - second * sin, second * cos + first * sin
    if style == "interleaved":
        out = rearrange(torch.stack([a, b], dim=-1), "b h t i two -> b h t (i two)")
    else:
        out = torch.cat([a, b], dim=-1)
    return out.to(x.dtype)


rotate = typechecked(rotate)


# ----------------------------------------------------------------------------------------------------
# Repro snippets
# ----------------------------------------------------------------------------------------------------


def import_line(obj: Any, as_name: str, *, search: tuple[str, ...] = ()) -> str | None:
    """A line that binds ``obj`` to ``as_name`` in a fresh interpreter (``from pkg.mod import NAME as as_name``),
    or None when it cannot be imported: defined in ``__main__``, inside a function, or not found under its name.
    A function or class is found by its qualified name; any other object (a spec) by a module-level name, in
    the modules ``search`` first."""
    import sys

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
    grows from one block of keys to the next (what a tiled kernel that forgets to rescale gets wrong).
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

    __shape_checked__ = ("mask", "inputs")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES_BY_NAME[self.dtype]

    def mask(self) -> KeepMask | None:
        """The keep-mask as a boolean tensor (or None)."""
        return None if self.keep is None else torch.tensor(self.keep, dtype=torch.bool)

    def inputs(self) -> Inputs:
        """Float64 inputs: ``q (b,h,t,d)``, ``k (b,g,s,d)``, ``v (b,g,s,dv)`` (modules: see ``widths``)."""
        ramp = 1.0 + self.ramp * torch.arange(self.s, dtype=torch.float64)[:, None] / max(self.s - 1, 1)
        if self.widths is not None:
            eq, ek, ev = self.widths
            x = randn((self.b, self.t, eq), self.seed) * self.amplitude
            if self.tied:
                return (x * ramp,) * 3 if self.ramp else (x, x, x)
            key = randn((self.b, self.s, ek), self.seed + 1) * self.amplitude * ramp
            return x, key, randn((self.b, self.s, ev), self.seed + 2)
        q = randn((self.b, self.h, self.t, self.d), self.seed) * self.amplitude
        k = randn((self.b, self.g, self.s, self.d), self.seed + 1) * self.amplitude * ramp
        v = randn((self.b, self.g, self.s, self.dv), self.seed + 2)
        return q, k, v


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


# ----------------------------------------------------------------------------------------------------
# The adapter protocol
# ----------------------------------------------------------------------------------------------------


class Adapter(Protocol):
    """What every check sees of a candidate: functions (:class:`FunctionAdapter`) and modules
    (:class:`ModuleAdapter`) alike. Inputs are float64 (see :meth:`Example.inputs`); ``keep`` is a canonical
    keep-mask ``(b, 1 or h, t, s)``; outputs are ``(b, h, t, dv)`` (functions) or ``(b, t, e)`` (modules),
    the query axis second to last in both."""

    name: str
    conventions: Conventions
    kind: Literal["function", "module"]
    #: sizes fixed by a module: h, g, d, dv and the input widths (None for a function)
    fixed: dict[str, int] | None
    #: the rotary embedding a module applies (base, style), None if none
    rotary: tuple[float, Literal["half", "interleaved"]] | None
    #: why the order of the keys matters (rotary positions, a position bias, a sliding window), None if it does not
    positional: str | None
    #: the longest sequence a module takes (its spec's ``max_length``), None: any
    longest: int | None

    def call(self, ins: Inputs, keep: KeepMask | None, is_causal: bool, dtype: torch.dtype) -> CandidateOutput: ...

    def reference(self, ins: Inputs, keep: KeepMask | None, is_causal: bool, dtype: torch.dtype
                  ) -> ReferenceOutput: ...

    def logit_bound(self, ins: Inputs) -> float: ...

    def logits(self, ins: Inputs) -> Float64[Tensor, "b h t s"]: ...

    def rows(self, keep: KeepMask, example: Example) -> Rows: ...

    def decode(self, ins: Inputs, dtype: torch.dtype) -> CandidateOutput | None: ...

    def fast_path(self, x: Float[Tensor, "b t e"], padding: Bool[Tensor, "b t"], dtype: torch.dtype
                  ) -> CandidateOutput | None: ...

    def repro(self, example: Example, check: str) -> str: ...


# ----------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------


@dataclass
class CheckResult:
    """The outcome of one check in one dtype: status, worst error ratio seen, examples run (shrinking not
    counted) and, on FAIL, the shrunk counterexample, a repro snippet and (when the candidate raised) the
    full traceback."""

    name: str
    status: Status
    dtype: str = ""
    ratio: float | None = None
    message: str = ""
    counterexample: dict[str, Any] | None = None
    repro: str | None = None
    examples: int = 0
    traceback: str | None = None


#: What the paper's attention (and this library's API) does, for each inferred field that changes what the
#: attention computes: an inferred value other than this is a *difference*, listed first in the report.
PAPER: dict[str, tuple[Any, str]] = {
    "scale": (None, "1/sqrt(d), d the head size"),
    "mask_polarity": ("keep", "True = may attend"),
    "causal_alignment": ("bottom-right", "with t != s, query i sees keys j <= i + s - t"),
    "fully_masked": ("zero", "a query row without any allowed key gives zeros"),
    "decode_sees_all": (False, "one query sees the keys the causal alignment gives it"),
    "always_causal": (False, "causal only when told is_causal=True"),
}


def expect_value(value: Any) -> str:
    """How ``--expect NAME=VALUE`` spells ``value`` (``1``, ``top-left``, ``true``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return "none" if value is None else str(value)


@dataclass(frozen=True)
class Difference:
    """An inferred convention that differs from the paper's attention (:data:`PAPER`): ``field`` behaves as
    ``value`` (``seen`` says on which input), where the paper has ``paper``. ``declared``: the user said so
    (``known=`` / ``--expect``), or a module's spec does; an undeclared difference fails the audit's
    :attr:`AuditReport.passed` (exit status 3 on the command line when every check passed)."""

    field: str
    value: Any
    paper: str
    seen: str
    declared: bool

    def declaration(self) -> str:
        """What to declare when the difference is intended."""
        return (f"known={{{self.field!r}: {self.value!r}}} (command line: --expect "
                f"{self.field}={expect_value(self.value)})")

    def line(self) -> str:
        head = f"{self.field} = {self.value!r} (the paper: {self.paper}): {self.seen}"
        if self.declared:
            return f"{head}; declared"
        return f"{head}; NOT DECLARED: if intended, declare {self.declaration()}"


@dataclass
class Cause:
    """One root cause: the rows it explains (references to the report's rows), the row whose counterexample and
    repro are printed, what is wrong in one line, and what a module's diagnosis found."""

    check: str
    rows: list[CheckResult]
    shown: CheckResult
    summary: str
    diagnosis: str | None = None

    def explains(self) -> str:
        """``"reference, causality [float32, float64]; gradients [float64]"``: checks grouped by their dtypes."""
        dtypes: dict[str, list[str]] = {}
        for row in self.rows:
            dtypes.setdefault(row.name, []).append(row.dtype or "-")
        groups: dict[tuple[str, ...], list[str]] = {}
        for name, seen in dtypes.items():
            groups.setdefault(tuple(seen), []).append(name)
        return "; ".join(f"{', '.join(names)} [{', '.join(d)}]" for d, names in groups.items())

    def lines(self, index: int, total: int) -> list[str]:
        row = self.shown
        title = self.summary + (f"; {self.diagnosis}" if self.diagnosis else "")
        lines = [f"root cause {index} of {total}: {title}", f"  explains {self.explains()}",
                 f"  {row.name} [{row.dtype or '-'}]: {row.message.splitlines()[0] if row.message else ''}",
                 f"  counterexample {json.dumps(row.counterexample)}"]
        if row.traceback:
            lines.append(row.traceback.rstrip())
        if row.repro:
            lines.append(row.repro)
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "summary": self.summary, "diagnosis": self.diagnosis,
                "explains": [[r.name, r.dtype] for r in self.rows], "shown": [self.shown.name, self.shown.dtype]}


def closing_line(results: Sequence[CheckResult], causes: Sequence[Cause], dtypes: Sequence[str],
                 undeclared: Sequence[str] = ()) -> str:
    """What was run, per dtype: ``float32: 12 passed; float64: 1 passed, 11 failed; 2 checks skipped; 1 root
    cause`` (the inferred ``conventions`` row first when there is one; the undeclared differences last)."""
    parts = []
    conventions = [r for r in results if r.name == "conventions"]
    if conventions:
        findings = sum(r.status == "FAIL" for r in conventions)
        said = f"FAIL ({findings} finding{'s' if findings != 1 else ''})" if findings else "PASS"
        parts.append(f"conventions {said}")
    rows = [r for r in results if r.name != "conventions"]
    for dtype in [d for d in dtypes if any(r.dtype == d for r in rows)]:
        passed = sum(r.dtype == dtype and r.status == "PASS" for r in rows)
        failed = sum(r.dtype == dtype and r.status == "FAIL" for r in rows)
        parts.append(f"{dtype}: {passed} passed" + (f", {failed} failed" if failed else ""))
    skipped = len({r.name for r in rows if r.status == "SKIP"})
    if skipped:
        parts.append(f"{skipped} check{'s' if skipped != 1 else ''} skipped")
    if causes:
        parts.append(f"{len(causes)} root cause{'s' if len(causes) != 1 else ''}")
    if undeclared:
        parts.append(f"not passed: undeclared difference{'s' if len(undeclared) != 1 else ''} from the paper's "
                     f"attention ({', '.join(undeclared)})")
    return "; ".join(parts)


@dataclass
class AuditReport:
    """Per-check, per-dtype results; ``str(report)`` is :meth:`table`."""

    candidate: str
    conventions: dict[str, Any]
    results: list[CheckResult]
    seed: int
    max_examples: int
    dtypes: list[str]
    tolerance: float
    environment: dict[str, Any] = field(default_factory=dict)
    untested: list[str] = field(default_factory=list)
    #: the inferred conventions and their evidence (``conventions="infer"``), or where declared conventions
    #: contradict the behaviour; printed at the top of the table
    inferred: list[str] = field(default_factory=list)
    #: declared conventions the behaviour contradicts, each with its witness (printed after the rows)
    contradictions: list[str] = field(default_factory=list)
    #: the failing rows grouped by root cause, each printed once with one counterexample and its repro
    causes: list[Cause] = field(default_factory=list)
    #: inferred conventions that differ from the paper's attention (``conventions="infer"`` only), printed first
    differences: list[Difference] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No check failed (SKIPs are allowed) and every difference from the paper's attention that inference
        found was declared (``known=``, ``--expect``, or a module's spec). :attr:`failed` names the failed checks,
        :attr:`undeclared` the undeclared differences."""
        return not self.failed and not self.undeclared

    @property
    def undeclared(self) -> list[str]:
        """The fields whose inferred value differs from the paper's attention and was not declared."""
        return [d.field for d in self.differences if not d.declared]

    @property
    def failed(self) -> list[str]:
        """Names of the checks that failed in at least one dtype, in check order."""
        return list(dict.fromkeys(r.name for r in self.results if r.status == "FAIL"))

    def status(self, name: str) -> Status:
        """FAIL if the check failed in any dtype, SKIP if skipped in all, else PASS."""
        statuses = {r.status for r in self.results if r.name == name}
        if not statuses:
            raise KeyError(name)
        return "FAIL" if "FAIL" in statuses else "PASS" if "PASS" in statuses else "SKIP"

    def __getitem__(self, name: str) -> CheckResult:
        """The failing row of check ``name`` if any, else its first row."""
        rows = [r for r in self.results if r.name == name]
        if not rows:
            raise KeyError(name)
        return next((r for r in rows if r.status == "FAIL"), rows[0])

    def table(self) -> str:
        """A plain-text table, one row per check and dtype, then the counterexample of every failure and what
        was not tested."""
        rows = [("check", "dtype", "status", "ratio", "detail")]
        for r in self.results:
            ratio = "-" if r.ratio is None else f"{r.ratio:.3g}"
            rows.append((r.name, r.dtype or "-", r.status, ratio, r.message.splitlines()[0] if r.message else ""))
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = [f"audit of {self.candidate} (seed {self.seed}, {self.max_examples} examples per check and dtype, "
                 f"dtypes {', '.join(self.dtypes)}, tolerance {self.tolerance:g}x reference error)"]
        if self.inferred:
            lines += [*self.inferred, ""]
        for index, row in enumerate(rows):
            lines.append(("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4]).rstrip())
            if index == 0:
                lines.append("  ".join("-" * w for w in widths) + "  ------")
        if self.contradictions:
            lines += ["", *self.contradictions]
        grouped = {id(r) for cause in self.causes for r in cause.rows}
        for r in self.results:  # failures outside every cause (the inferred conventions' findings)
            if r.status == "FAIL" and id(r) not in grouped:
                lines += ["", f"{r.name} [{r.dtype or '-'}]: counterexample {json.dumps(r.counterexample)}"]
                if r.traceback:
                    lines.append(r.traceback.rstrip())
                if r.repro:
                    lines.append(r.repro)
        for index, cause in enumerate(self.causes, start=1):
            lines += ["", *cause.lines(index, len(self.causes))]
        if self.untested:
            how = "inferred" if any(line.startswith("inferred") for line in self.inferred) else "declared"
            lines += ["", f"not tested ({how} unsupported):"] + [f"  - {note}" for note in self.untested]
        lines += ["", closing_line(self.results, self.causes, self.dtypes, self.undeclared)]
        return "\n".join(lines)

    __str__ = table

    def to_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate, "checks_version": CHECKS_VERSION, "passed": self.passed,
                "undeclared": self.undeclared, "differences": [dataclasses.asdict(d) for d in self.differences],
                "conventions": self.conventions, "seed": self.seed, "max_examples": self.max_examples,
                "dtypes": self.dtypes, "tolerance": self.tolerance, "environment": self.environment,
                "untested": self.untested, "inferred": self.inferred, "contradictions": self.contradictions,
                "results": [dataclasses.asdict(r) for r in self.results],
                "causes": [cause.to_dict() for cause in self.causes]}

    def to_json(self, path: str | None = None) -> str:
        """The report as JSON (written to ``path`` too when given)."""
        text = json.dumps(self.to_dict(), indent=2, default=str)
        if path is not None:
            with open(path, "w", encoding="utf-8") as file:
                file.write(text + "\n")
        return text


def environment() -> dict[str, Any]:
    return {"torch": torch.__version__, "typed_transformer": importlib.metadata.version("typed-transformer"),
            "deterministic": torch.are_deterministic_algorithms_enabled(), "device": "cpu"}


# ----------------------------------------------------------------------------------------------------
# Check machinery
# ----------------------------------------------------------------------------------------------------


class CheckFailure(AssertionError):
    """A check found the candidate wrong on ``example``."""

    def __init__(self, message: str, example: Example | None = None, ratio: float | None = None) -> None:
        super().__init__(message)
        self.example = example
        self.ratio = ratio


class Skip(Exception):
    """The check does not apply to this candidate (the message says why)."""


class CandidateRaised(Exception):
    """The candidate's own code raised (the exception is the ``__cause__``), or modified one of its inputs in
    place: a failure of the check. Any other exception inside a check is a bug of the audit and propagates."""


class CandidateStopped(BaseException):
    """A call of the candidate ended the interpreter (``sys.exit``) or did not return within the time limit
    (:func:`call_time_limit`): the audit stops there, its report unfinished, and this names the call (the check,
    the dtype and the example, when the call was a check's; an inference probe's has none). A ``BaseException``,
    as the ``SystemExit`` it reports: nothing that catches ``Exception`` (the candidate, Hypothesis) swallows it,
    and Hypothesis does not rerun a hung call to shrink it."""

    def __init__(self, what: str, check: str | None = None, dtype: str | None = None,
                 example: "Example | None" = None) -> None:
        super().__init__(what)
        self.what, self.check, self.dtype, self.example = what, check, dtype, example

    def line(self) -> str:
        """One line: which call, and what it did."""
        where = (" probing its conventions (--infer)" if self.check is None
                 else f" in check {self.check} [{self.dtype or '-'}]")
        shapes = "" if self.example is None else (f" (b={self.example.b} h={self.example.h} g={self.example.g} "
                                                  f"t={self.example.t} s={self.example.s} d={self.example.d} "
                                                  f"dv={self.example.dv}, seed {self.example.seed})")
        return f"FAIL: a call of the candidate{where}{shapes} {self.what}; the audit stopped there"

    def __str__(self) -> str:
        return self.line()


#: The default time limit of one call of the candidate, in seconds: the audit's inputs are small (a correct
#: candidate answers in milliseconds), so this is only ever reached by a call that hangs.
DEFAULT_CALL_TIME_LIMIT = 60.0
_CALL_TIME_LIMIT: ContextVar[float | None] = ContextVar("call_time_limit", default=DEFAULT_CALL_TIME_LIMIT)


@contextmanager
def call_time_limit(seconds: float | None) -> Iterator[None]:
    """Audits run inside give each call of the candidate ``seconds`` (``None``: no limit; default
    :data:`DEFAULT_CALL_TIME_LIMIT`); a call past it stops the audit with :class:`CandidateStopped`. The limit is
    a ``SIGALRM`` timer that raises in the candidate's Python code, so it holds in the main thread of a POSIX
    process only (elsewhere calls run unlimited), and a single C call that never returns (a torch kernel) is
    out of its reach: run the audit in a child process with a timeout for that."""
    if seconds is not None and not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"call_time_limit: seconds must be positive and finite or None, got {seconds!r}")
    token = _CALL_TIME_LIMIT.set(seconds)
    try:
        yield
    finally:
        _CALL_TIME_LIMIT.reset(token)


class _TimedOut(BaseException):
    """Raised in the candidate's code by the call's timer (a BaseException: ``except Exception`` lets it by)."""


class _Alarm:
    """The call's timer: SIGALRM after ``seconds``, then every second until the call is over (a candidate that
    swallows one gets the next); the previous handler and timer are restored after. Hand-written: no library
    interrupts a call in the running thread."""

    def __init__(self, seconds: float | None) -> None:
        usable = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
        self.seconds = seconds if usable else None
        self.armed = self.fired = False

    def _ring(self, signum: int, frame: FrameType | None) -> None:
        self.fired = True
        if self.armed:
            raise _TimedOut

    def __enter__(self) -> None:
        if self.seconds is None:
            return
        self.started = time.monotonic()
        self.previous = signal.signal(signal.SIGALRM, self._ring)
        self.previous_timer = signal.setitimer(signal.ITIMER_REAL, self.seconds, 1.0)
        self.armed = True

    def __exit__(self, *exc: object) -> None:
        if self.seconds is None:
            return
        self.armed = False
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, self.previous)
            left, interval = self.previous_timer
            if left > 0:  # an enclosing timer keeps running (nested calls)
                signal.setitimer(signal.ITIMER_REAL, max(left - (time.monotonic() - self.started), 1e-3), interval)


def _modified(before: Tensor, after: Tensor) -> bool:
    if before.shape != after.shape or before.dtype != after.dtype:
        return True
    return not torch.equal(torch.nan_to_num(before), torch.nan_to_num(after.detach())) or not torch.equal(
        before.isnan(), after.detach().isnan())


@contextmanager
def candidate_code(**inputs: Tensor | None) -> Iterator[None]:
    """Run the candidate's code: its exceptions become :class:`CandidateRaised`, and so does a change it made
    to one of the named ``inputs`` (compared with copies after the call); ``sys.exit`` or a call past the time
    limit (:func:`call_time_limit`) raises :class:`CandidateStopped`. ``KeyboardInterrupt`` (Ctrl-C, and the
    command line's SIGTERM) passes through."""
    copies = {name: x.detach().clone() for name, x in inputs.items() if isinstance(x, Tensor)}
    limit = _CALL_TIME_LIMIT.get()
    alarm = _Alarm(limit)
    try:
        with alarm:
            yield
    except (CheckFailure, Skip, CandidateRaised, CandidateStopped, KeyboardInterrupt):
        raise
    except _TimedOut:
        pass  # the flag says it below
    except SystemExit as exit_:
        raise CandidateStopped(f"called sys.exit({exit_.code!r})") from None
    except BaseException as err:
        raise CandidateRaised(f"{type(err).__name__}: {err}") from err
    if alarm.fired:
        raise CandidateStopped(f"did not return within the time limit of {limit:g} s per call")
    for name, before in copies.items():
        after = inputs[name]
        if isinstance(after, Tensor) and _modified(before, after):
            raise CandidateRaised(f"the candidate modified its input {name} in place during the call (the "
                                  f"counterexample's): inputs must be left as given")


#: Which deep examples a search draws (see :class:`Budget`).
Deep: TypeAlias = Literal["lengths", "sizes"]


@dataclass(frozen=True)
class Budget:
    """How deep the audit looks. Beside ``max_examples`` small examples per check and dtype (sizes 1..6, which
    shrink well), ``deep_examples`` more are drawn at the sizes kernels get wrong: key and query lengths on both
    sides of the tiles kernels use (``lengths``), the head sizes kernels specialise with small lengths
    (``head_sizes``), batches and head counts above 4 with small lengths (``batches``, ``heads``), each with the
    check's masks and causal setting. Each list is ordered small to large and drawn with ``sampled_from``, which
    shrinks towards its first element: a bug first seen at 129 keys is reported at the smallest listed length that
    still fails (17 for a kernel whose 16-key blocks forget to rescale). The lengths run as their own search of
    ``deep_examples`` examples, head sizes and batches as one more of half as many; when a deep example fails,
    each listed size below the failing one is searched alone (as many examples), smallest first, and the first
    that fails is reported: a failure Hypothesis could not shrink past its seed is still reported at the smallest
    failing size.
    ``half_precision``: a function is audited in float16 and bfloat16 too when it accepts them and ``dtypes`` is
    not given. ``quick`` (the audit before budgets: its sizes, float32 and float64) has no deep examples and no
    half precision by default."""

    name: str = "default"
    lengths: tuple[int, ...] = (15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129)
    head_sizes: tuple[int, ...] = (64, 65, 80, 96, 127, 128, 256)
    batches: tuple[int, ...] = (5, 8, 9)
    heads: tuple[int, ...] = (5, 6, 8)
    deep_examples: int = 6
    half_precision: bool = True

    def __post_init__(self) -> None:
        for name in ("lengths", "head_sizes", "batches", "heads"):
            values = getattr(self, name)
            if any(not isinstance(v, int) or v < 1 for v in values) or list(values) != sorted(set(values)):
                raise ValueError(f"Budget: {name} must be positive integers in increasing order; got {values}")
        if self.deep_examples < 0:
            raise ValueError(f"Budget: deep_examples must be >= 0; got {self.deep_examples}")


#: The budgets by name: ``quick`` draws only the small examples, ``default`` reaches the tiles too.
BUDGETS = {"quick": Budget("quick", (), (), (), (), 0, half_precision=False), "default": Budget()}


def resolve_budget(budget: "Budget | str") -> Budget:
    """A :class:`Budget` or the name of one in :data:`BUDGETS`."""
    if isinstance(budget, Budget):
        return budget
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; choose {', '.join(BUDGETS)} or pass a Budget")
    return BUDGETS[budget]


@dataclass
class Run:
    """State shared by the examples of one check: worst passing ratio, examples run before the first failure,
    the example being run, the budget and whether its deep examples (tile-crossing sizes) are being drawn."""

    adapter: Adapter
    dtype: torch.dtype
    tolerance: float
    worst: float = 0.0
    examples: int = 0
    failing: bool = False
    current: Example | None = None
    budget: Budget = field(default_factory=Budget)
    #: None: the small examples; "lengths": the budget's lengths; "sizes": its head sizes, batches and heads
    deep: "Deep | None" = None

    def note(self, ratio: float) -> None:
        if math.isfinite(ratio):
            self.worst = max(self.worst, ratio)


CheckBody: TypeAlias = Callable[[Run, st.DataObject], None]


@dataclass(frozen=True)
class Check:
    """A registered check: its body, and whether it applies to functions, modules or both."""

    name: str
    body: CheckBody
    kinds: tuple[str, ...] = ("function", "module")
    doc: str = ""
    #: whether the budget's deep examples apply (False: the check draws its own sizes)
    deep: bool = True


REGISTRY: dict[str, Check] = {}


def register(name: str, *, kinds: tuple[str, ...] = ("function", "module"), deep: bool = True
             ) -> Callable[[CheckBody], CheckBody]:
    """Register a check body under ``name`` (the order of registration is the order of the report)."""

    def wrap(body: CheckBody) -> CheckBody:
        REGISTRY[name] = Check(name, body, kinds, (body.__doc__ or "").strip(), deep)
        return body

    return wrap


def run_check(check: Check, adapter: Adapter, dtype: torch.dtype, *, max_examples: int, seed: int,
              tolerance: float, budget: Budget | None = None) -> CheckResult:
    """Run ``check`` on ``adapter`` for inputs in ``dtype`` as Hypothesis tests (shrinking on): the small
    examples, then (when they pass) the budget's deep examples; the row counts both."""
    budget = BUDGETS["quick"] if budget is None else budget
    result = _run_phase(check, Run(adapter, dtype, tolerance, budget=budget), max_examples, seed)
    if not check.deep or not budget.deep_examples:
        return result
    # the lengths (where tiled kernels fail) in their own search, then head sizes and batches in half as many
    phases: list[tuple[Deep, int]] = [("lengths", budget.deep_examples), ("sizes", -(-budget.deep_examples // 2))]
    for deep, examples in phases:
        if result.status != "PASS":
            break
        more = _run_phase(check, Run(adapter, dtype, tolerance, budget=budget, deep=deep), examples, seed)
        more.examples += result.examples
        if more.status == "PASS":
            more.ratio = max(result.ratio or 0.0, more.ratio or 0.0)
        else:
            more = _smallest(check, Run(adapter, dtype, tolerance, budget=budget, deep=deep), more, examples, seed)
        result = more
    return result


def _smallest(check: Check, run: Run, failed: CheckResult, examples: int, seed: int) -> CheckResult:
    """``failed`` (a deep example's failure), or the failure of a search at the smallest listed size below its
    size on the same axis that fails: one search per size, smallest first. Hypothesis lowers a listed size only
    while the rest of the example (its seed, shrunk to 0 first) still fails, which can leave it at 127 keys
    when 65 fail too."""
    if failed.counterexample is None:
        return failed
    for below in _below(run.budget, run.deep, failed.counterexample):
        retry = _run_phase(check, dataclasses.replace(run, budget=below), examples, seed)
        failed.examples += retry.examples
        if retry.status == "FAIL":
            retry.examples = failed.examples
            return retry
    return failed


def _below(budget: Budget, deep: "Deep | None", example: dict[str, Any]) -> list[Budget]:
    """One budget per listed size below ``example``'s on the failing axis (the key length for lengths; the batch,
    else the head size, for sizes), smallest first, each drawing that size alone on that axis."""
    if deep == "lengths":
        return [dataclasses.replace(budget, lengths=(n,)) for n in budget.lengths if n < example["s"]]
    if example["b"] in budget.batches:
        return [dataclasses.replace(budget, head_sizes=(), batches=(n,)) for n in budget.batches if n < example["b"]]
    if example.get("d") in budget.head_sizes:
        return [dataclasses.replace(budget, head_sizes=(n,), batches=()) for n in budget.head_sizes
                if n < example["d"]]
    return []


def _fields(example: Example) -> dict[str, Any]:
    """The counterexample as the report prints it: ``ramp`` only where the keys grow (a deep length)."""
    fields = dataclasses.asdict(example)
    if not example.ramp:
        del fields["ramp"]
    return fields


def _run_phase(check: Check, run: Run, max_examples: int, seed: int) -> CheckResult:
    """One Hypothesis test of ``check`` (``run.deep``: at the budget's deep sizes)."""
    adapter, dtype_name = run.adapter, DTYPE_NAMES[run.dtype]

    @settings(max_examples=max_examples, deadline=None, database=None, derandomize=False, phases=_PHASES,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False, print_blob=False)
    @hypothesis_seed(seed)
    @given(st.data())
    def test(data: st.DataObject) -> None:
        if not run.failing:
            run.examples += 1
        run.current = None
        try:
            check.body(run, data)
        except CheckFailure as failure:
            run.failing = True
            if failure.example is None:
                failure.example = run.current
            raise
        except Skip:
            raise
        except CandidateRaised as raised:  # the candidate raised: that is a failure of this check
            run.failing = True
            err = raised.__cause__
            if err is None:  # the wrapper's own finding about the call (an input modified in place)
                raise CheckFailure(str(raised), run.current) from raised
            first_line = str(err).splitlines()[0] if str(err) else ""
            raise CheckFailure(f"candidate raised {type(err).__name__}: {first_line}", run.current) from err

    try:
        test()
    except CandidateStopped as stopped:  # the call that ended or hung: named, then the audit stops
        if stopped.check is None:
            stopped.check, stopped.dtype, stopped.example = check.name, dtype_name, run.current
        raise
    except Skip as skip:
        return CheckResult(check.name, "SKIP", dtype_name, message=str(skip))
    except CheckFailure as failure:
        example = failure.example
        cause = failure.__cause__
        trace = None if cause is None else "".join(traceback.format_exception(cause)).rstrip()
        return CheckResult(check.name, "FAIL", dtype_name, ratio=failure.ratio, message=str(failure),
                           counterexample=None if example is None else _fields(example),
                           repro=None if example is None else adapter.repro(example, check.name),
                           examples=run.examples, traceback=trace)
    return CheckResult(check.name, "PASS", dtype_name, ratio=run.worst, examples=run.examples)
