"""Attention modules with their own weights: a declarative :class:`ModuleSpec` says where the projections,
head counts, scale and rotary embedding live and how to call ``forward``; :class:`ModuleAdapter` copies the
weights into the reference and runs every check on a deep copy of the module."""

import copy
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from einops import einsum, rearrange
from torch import Tensor, nn

from ._core import (
    DEFAULT_CONVENTIONS,
    AuditReport,
    AuditUsageError,
    Conventions,
    Example,
    Inputs,
    candidate_code,
    reference_attention,
    rotate,
)
from ._functions import run_audit

#: ``forward(module, x, key, value, keep, is_causal) -> (b, t, e)``: call the module on ``x (b, t, eq)`` (and
#: ``key (b, s, ek)``, ``value (b, s, ev)``; both None for a self-attention spec) with the canonical keep-mask
#: ``keep (b, 1 or h, t, s)`` (True = may attend, or None) in the module's own convention.
Forward = Callable[[Any, Tensor, Tensor | None, Tensor | None, Tensor | None, bool], Tensor]


@dataclass(frozen=True)
class Rotary:
    """Where a module's rotary embedding is described: ``base`` (a number or an attribute path such as
    ``"config.rope_theta"``) and the pairing, ``"half"`` (``x[i]`` with ``x[i + d/2]``) or ``"interleaved"``
    (``x[2i]`` with ``x[2i + 1]``)."""

    base: float | str = 10000.0
    style: Literal["half", "interleaved"] = "half"
    #: an attribute that is None when the module has no rotary embedding (e.g. ``"rotary"``)
    when: str | None = None


@dataclass(frozen=True)
class Weights:
    """A module's projections in float64, query heads in canonical ``(g r)`` order: ``w* (out, in)``."""

    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor | None
    bq: Tensor | None
    bk: Tensor | None
    bv: Tensor | None
    bo: Tensor | None
    h: int
    g: int
    d: int
    dv: int
    scale: float


@dataclass(frozen=True)
class ModuleSpec:
    """How to audit one kind of attention module. Attribute paths are dotted (``"config.num_heads"``; a path
    may step into a dict). A projection is a module with ``weight`` and ``bias`` (``nn.Linear``), given by
    ``q``/``k``/``v`` or by ``qkv`` (one fused projection whose output is ``[q; k; v]``); ``transposed``:
    weights stored ``(in, out)`` (Hugging Face's ``Conv1D``). ``out=None``: no output projection.
    ``num_kv_heads=None``: as many as query heads; ``head_dim=None``: query width / heads; ``scale=None``:
    ``1 / sqrt(head_dim)``. ``grouping``: ``"g r"`` (query head ``i`` uses kv head ``i // r``) or ``"r g"``
    (``i % g``). ``weights`` replaces the attribute lookup for modules it cannot describe. ``decode(module,
    x)`` runs ``x (b, t, e)`` token by token with the module's KV cache; ``fast_path(module, x, real)`` calls
    its inference fast path with a key padding mask (True = real token); ``build(cls, config)`` constructs
    the module for the CLI. ``conventions`` say what the module supports (``self_attention=True``: one
    input)."""

    name: str
    forward: Forward
    conventions: Conventions = DEFAULT_CONVENTIONS
    q: str | None = "q_proj"
    k: str | None = "k_proj"
    v: str | None = "v_proj"
    qkv: str | None = None
    out: str | None = "o_proj"
    transposed: bool = False
    num_heads: str = "num_heads"
    num_kv_heads: str | None = None
    head_dim: str | None = None
    scale: float | str | None = None
    grouping: Literal["g r", "r g"] = "g r"
    rotary: Rotary | None = None
    weights: Callable[[Any], "Weights"] | None = None
    decode: Callable[[Any, Tensor], Tensor] | None = None
    fast_path: Callable[[Any, Tensor, Tensor], Tensor | None] | None = None
    build: Callable[[type, dict[str, Any]], nn.Module] | None = None
    module_type: str = ""


def resolve(module: Any, path: str, spec: str) -> Any:
    """``module.a.b`` for ``path="a.b"`` (steps into dicts too); a missing attribute is an
    :class:`AuditUsageError` that names it."""
    value = module
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif hasattr(value, part):
            value = getattr(value, part)
        else:
            raise AuditUsageError(f"{type(module).__name__} does not match spec {spec!r}: it has no attribute "
                                  f"{path!r} ({part!r} is missing on {type(value).__name__})")
    return value


def _linear(module: Any, path: str, spec: ModuleSpec) -> tuple[Tensor, Tensor | None]:
    layer = resolve(module, path, spec.name)
    weight = getattr(layer, "weight", None)
    if not isinstance(weight, Tensor):
        raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: {path!r} is a "
                              f"{type(layer).__name__} without a weight tensor")
    bias = getattr(layer, "bias", None)
    w = weight.detach().double()
    return (w.T if spec.transposed else w), (None if bias is None else bias.detach().double())


def spec_weights(module: Any, spec: ModuleSpec) -> Weights:
    """Read the module's projections as the spec describes them."""
    if spec.weights is not None:
        return spec.weights(module)
    h = int(resolve(module, spec.num_heads, spec.name))
    g = h if spec.num_kv_heads is None else int(resolve(module, spec.num_kv_heads, spec.name))
    if spec.qkv is not None:
        w, b = _linear(module, spec.qkv, spec)
        if spec.head_dim is not None:  # [q (h d); k (g d); v (the rest)]
            d = int(resolve(module, spec.head_dim, spec.name))
            sizes = [h * d, g * d, w.shape[0] - (h + g) * d]
        elif w.shape[0] % 3 == 0:
            sizes = [w.shape[0] // 3] * 3
        else:
            sizes = []
        if len(sizes) != 3 or min(sizes) <= 0:
            raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: fused {spec.qkv!r} "
                                  f"has {w.shape[0]} outputs, which do not split into q, k and v")
        wq, wk, wv = torch.split(w, sizes)
        bq, bk, bv = (None, None, None) if b is None else torch.split(b, sizes)
    else:
        for name in ("q", "k", "v"):
            if getattr(spec, name) is None:
                raise AuditUsageError(f"spec {spec.name!r}: give qkv or all of q, k and v")
        (wq, bq), (wk, bk), (wv, bv) = (_linear(module, getattr(spec, n), spec) for n in ("q", "k", "v"))
    wo, bo = (None, None) if spec.out is None else _linear(module, spec.out, spec)
    d = wq.shape[0] // h if spec.head_dim is None else int(resolve(module, spec.head_dim, spec.name))
    if wq.shape[0] != h * d or wk.shape[0] % g or wv.shape[0] % g or wk.shape[0] // g != d:
        raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: projections of "
                              f"{wq.shape[0]}/{wk.shape[0]}/{wv.shape[0]} outputs do not split into {h} query heads "
                              f"and {g} key/value heads of size {d}")
    dv = wv.shape[0] // g
    if spec.grouping == "r g" and g != h:  # to canonical (g r) order
        wq = rearrange(wq, "(r g d) e -> (g r d) e", g=g, d=d)
        bq = None if bq is None else rearrange(bq, "(r g d) -> (g r d)", g=g, d=d)
        if wo is not None:
            wo = rearrange(wo, "o (r g dv) -> o (g r dv)", g=g, dv=dv)
    scale = 1.0 / math.sqrt(d) if spec.scale is None else float(
        spec.scale if isinstance(spec.scale, float | int) else resolve(module, spec.scale, spec.name))
    return Weights(wq, wk, wv, wo, bq, bk, bv, bo, h, g, d, dv, scale)


def additive_mask(keep: Tensor | None, dtype: torch.dtype, fill: float | None = None) -> Tensor | None:
    """A keep-mask as an additive float mask: 0 where allowed, ``fill`` (default ``finfo(dtype).min``, as
    Hugging Face builds them) elsewhere."""
    if keep is None:
        return None
    fill = torch.finfo(dtype).min if fill is None else fill
    return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, fill)


def with_causal(keep: Tensor | None, is_causal: bool, t: int, s: int) -> Tensor | None:
    """``keep`` ANDed with our bottom-right causal mask (for modules whose causality is a mask argument)."""
    if not is_causal:
        return keep
    from ..masks import causal_mask

    causal = causal_mask(t, s)[None, None]
    return causal if keep is None else keep & causal


class ModuleAdapter:
    """The :class:`~typed_transformer.audit._core.Adapter` of a module: the checks call a deep copy of it (one
    per dtype, in eval mode); the reference uses its weights in float64."""

    kind: Literal["function", "module"] = "module"

    def __init__(self, module: nn.Module, spec: ModuleSpec, *, conventions: Conventions | None = None,
                 name: str | None = None) -> None:
        if spec.module_type and not any(spec.module_type == f"{c.__module__}.{c.__qualname__}"
                                        for c in type(module).__mro__):
            raise AuditUsageError(f"{type(module).__module__}.{type(module).__qualname__} does not match spec "
                                  f"{spec.name!r}: expected a {spec.module_type}")
        self.spec = spec
        self.original = copy.deepcopy(module).eval()
        self.weights = spec_weights(self.original, spec)
        w = self.weights
        self.conventions = dataclasses.replace(conventions or spec.conventions, scale=w.scale,
                                               supports_gqa=w.g != w.h)
        self.name = name or f"{type(module).__module__}.{type(module).__qualname__} (spec {spec.name})"
        tied = self.conventions.self_attention
        self.fixed: dict[str, int] | None = {
            "h": w.h, "g": w.g, "d": w.d, "dv": w.dv, "eq": w.wq.shape[1], "ek": w.wk.shape[1],
            "ev": w.wv.shape[1], "tied": int(tied), "fast_path": int(spec.fast_path is not None)}
        self.rotary: tuple[float, Literal["half", "interleaved"]] | None = None
        if spec.rotary is not None and (spec.rotary.when is None
                                        or resolve(self.original, spec.rotary.when, spec.name) is not None):
            base = spec.rotary.base
            base = float(base if isinstance(base, float | int) else resolve(self.original, base, spec.name))
            self.rotary = (base, spec.rotary.style)
        self._copies: dict[torch.dtype, nn.Module] = {}

    def module(self, dtype: torch.dtype) -> nn.Module:
        """The module copy in ``dtype`` (made once)."""
        if dtype not in self._copies:
            self._copies[dtype] = copy.deepcopy(self.original).to(dtype).eval()
        return self._copies[dtype]

    def call(self, ins: Inputs, keep: Tensor | None, is_causal: bool, dtype: torch.dtype) -> Tensor:
        x, key, value = (z.to(dtype) for z in ins)
        module = self.module(dtype)
        with candidate_code():
            if self.conventions.self_attention:
                return self.spec.forward(module, x, None, None, keep, is_causal)
            return self.spec.forward(module, x, key, value, keep, is_causal)

    def _project(self, ins: Inputs, dtype: torch.dtype, offset: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        w = self.weights
        x, key, value = (z.to(dtype) for z in ins)

        def lin(z: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
            y = einsum(z, weight.to(dtype), "b t e, o e -> b t o")
            return y if bias is None else y + bias.to(dtype)

        q = rearrange(lin(x, w.wq, w.bq), "b t (h d) -> b h t d", h=w.h)
        k = rearrange(lin(key, w.wk, w.bk), "b s (g d) -> b g s d", g=w.g)
        v = rearrange(lin(value, w.wv, w.bv), "b s (g d) -> b g s d", g=w.g)
        if self.rotary is not None:
            q, k = rotate(q, *self.rotary, offset=offset), rotate(k, *self.rotary, offset=offset)
        return q, k, v

    def reference(self, ins: Inputs, keep: Tensor | None, is_causal: bool, dtype: torch.dtype) -> Tensor:
        q, k, v = self._project(ins, dtype)
        out = reference_attention(q, k, v, keep, is_causal=is_causal, conventions=self.conventions)
        out = rearrange(out, "b h t dv -> b t (h dv)")
        w = self.weights
        if w.wo is None:
            return out
        out = einsum(out, w.wo.to(dtype), "b t i, o i -> b t o")
        return out if w.bo is None else out + w.bo.to(dtype)

    def logit_bound(self, ins: Inputs) -> float:
        q, k, _ = self._project(ins, torch.float64)
        grouped = rearrange(q.abs(), "b (g r) t d -> b g r t d", g=k.shape[1])
        return float(einsum(grouped, k.abs(), "b g r t d, b g s d -> b g r t s").max()) * abs(self.weights.scale)

    def logits(self, ins: Inputs) -> Tensor:
        """The float64 logits ``(b, h, t, s)`` of the reference."""
        q, k, _ = self._project(ins, torch.float64)
        grouped = rearrange(q, "b (g r) t d -> b g r t d", g=k.shape[1])
        logits = einsum(grouped, k, "b g r t d, b g s d -> b g r t s") * self.weights.scale
        return rearrange(logits, "b g r t s -> b (g r) t s")

    def rows(self, keep: Tensor, example: Example) -> Tensor:
        return rearrange(keep.any(dim=-1).all(dim=1), "b t -> b t 1")

    def decode(self, ins: Inputs, dtype: torch.dtype) -> Tensor | None:
        if self.spec.decode is None:
            return None
        module = copy.deepcopy(self.module(dtype))
        with candidate_code():
            return self.spec.decode(module, ins[0].to(dtype))

    def fast_path(self, x: Tensor, padding: Tensor, dtype: torch.dtype) -> Tensor | None:
        if self.spec.fast_path is None:
            return None
        module = copy.deepcopy(self.module(dtype))
        with candidate_code():
            return self.spec.fast_path(module, x.to(dtype), padding)

    def repro(self, example: Example, check: str) -> str:
        fields = ", ".join(f"{key}={value!r}" for key, value in dataclasses.asdict(example).items())
        return (f"from typed_transformer.audit import Example, ModuleAdapter, SPECS\n"
                f"example = Example({fields})\n"
                f"adapter = ModuleAdapter(module, SPECS[{self.spec.name!r}])  # module = {self.name}\n"
                f"out = adapter.call(example.inputs(), example.mask(), example.is_causal, example.torch_dtype)\n"
                f"ref = adapter.reference(example.inputs(), example.mask(), example.is_causal, torch.float64)"
                f"  # check {check}")


def audit_module(
    module: nn.Module | Callable[[], nn.Module],
    spec: "ModuleSpec | str",
    *,
    conventions: Conventions | Literal["infer"] | None = None,
    fully_masked: Literal["zero", "nan", "uniform", "any"] | None = None,
    checks: Sequence[str] | None = None,
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float64),
    max_examples: int = 10,
    seed: int = 0,
    tolerance: float = 2.0,
    name: str | None = None,
) -> AuditReport:
    """Audit an attention module with its own weights against the reference (every check that applies to
    modules, once per dtype). The module (or the one a factory builds) is deep-copied first: the caller's
    module is left exactly as it was (parameters, dtype, train/eval mode, gradients). ``checks``, ``dtypes``,
    ``max_examples``, ``seed``, ``tolerance`` and ``name`` are as in :func:`audit_attention`.

    Args:
        module: the module, or a zero-argument factory of one.
        spec: a :class:`ModuleSpec` or the name of a shipped one (:data:`SPECS`).
        conventions: override the spec's conventions, or ``"infer"``: the spec says where the weights live,
            inference decides the behavioural fields (causal alignment and decode rule, always causal, fully
            masked rows, masks with ``is_causal``) and the report opens with them.
        fully_masked: override only what a query row without allowed keys gives.

    Raises:
        AuditUsageError: the module does not match the spec (the message names the missing attribute).
        KeyError: an unknown spec name.
    """
    from .specs import SPECS

    if isinstance(spec, str):
        if spec not in SPECS:
            raise KeyError(f"unknown spec {spec!r}; shipped specs: {', '.join(SPECS)}")
        spec = SPECS[spec]
    from ._infer import contradictions, infer_adapter, with_inference

    candidate = module if isinstance(module, nn.Module) else module()
    infer = conventions == "infer"
    conv = spec.conventions if conventions is None or conventions == "infer" else conventions
    if fully_masked is not None:
        conv = dataclasses.replace(conv, fully_masked=fully_masked)
    adapter = ModuleAdapter(candidate, spec, conventions=conv, name=name)
    inference = infer_adapter(adapter, seed=seed) if infer else None
    if inference is not None:
        adapter.conventions = inference.conventions
    described = {"spec": spec.name, **dataclasses.asdict(adapter.conventions)}
    report = run_audit(adapter, checks=checks, dtypes=dtypes, max_examples=max_examples, seed=seed,
                       tolerance=tolerance, conventions=described)
    if inference is not None:
        return with_inference(report, inference)
    if not report.passed:
        report.contradictions = contradictions(adapter.conventions, infer_adapter(adapter, seed=seed))
    return report
