"""A module's weights, read by its spec into the reference's projections, norms, gates and latent projections."""

import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from einops import einsum, rearrange, repeat
from torch import Tensor, nn

from ..core.conventions import AuditUsageError
from .spec import ModuleSpec, Weights, resolve
from .variants import Latent


def _linear(module: Any, path: str, spec: ModuleSpec) -> tuple[Tensor, Tensor | None]:
    layer = resolve(module, path, spec.name)
    weight = getattr(layer, "weight", None)
    if not isinstance(weight, Tensor):
        raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: {path!r} is a "
                              f"{type(layer).__name__} without a weight tensor")
    bias = getattr(layer, "bias", None)
    w = weight.detach().double()
    if isinstance(layer, nn.Conv1d) and w.ndim == 3 and w.shape[-1] == 1:
        # a 1x1 convolution over channels (SqueezeBERT's): a linear map, block-diagonal in its groups
        w = torch.block_diag(*w[:, :, 0].chunk(int(layer.groups), dim=0))  # type: ignore[no-untyped-call]
    return (w.T if spec.transposed else w), (None if bias is None else bias.detach().double())


def spec_weights(module: Any, spec: ModuleSpec) -> Weights:
    """Read the module's projections as the spec describes them."""
    if spec.weights is not None:
        return spec.weights(module)
    if spec.latent is not None:
        return latent_weights(module, spec)
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
        if spec.qkv_layout == "heads":  # GPT-NeoX: (h [q k v] d), one kv head per query head
            if g != h or sizes[0] != sizes[1] or sizes[1] != sizes[2]:
                raise AuditUsageError(f"spec {spec.name!r}: qkv_layout='heads' needs as many key/value heads as "
                                      f"query heads and equal q, k, v sizes")
            wq, wk, wv = rearrange(w, "(h three d) e -> three (h d) e", h=h, three=3)
            bq, bk, bv = (None, None, None) if b is None else rearrange(b, "(h three d) -> three (h d)", h=h, three=3)
        elif spec.qkv_layout == "groups":  # Falcon: (g [q_1 .. q_r k v] d), each kv group after its query heads
            if h % g or sizes[1] != sizes[2] or sizes[0] // h != sizes[1] // g:
                raise AuditUsageError(f"spec {spec.name!r}: qkv_layout='groups' needs a whole number of query heads "
                                      f"per key/value head and equal q, k, v head sizes")
            wq, wk, wv = _split_groups(w, g, h // g)
            bq, bk, bv = (None, None, None) if b is None else (z[:, 0] for z in _split_groups(b[:, None], g, h // g))
        else:
            wq, wk, wv = torch.split(w, sizes)
            bq, bk, bv = (None, None, None) if b is None else torch.split(b, sizes)
    else:
        for name in ("q", "k", "v"):
            if getattr(spec, name) is None:
                raise AuditUsageError(f"spec {spec.name!r}: give qkv or all of q, k and v")
        (wq, bq), (wk, bk), (wv, bv) = (_linear(module, getattr(spec, n), spec) for n in ("q", "k", "v"))
    wo, bo = (None, None) if spec.out is None else _linear(module, spec.out, spec)
    wg, bg = None, None
    if spec.gate is not None and spec.gate.in_query:  # Qwen3-Next: q_proj rows (h [query gate] d)
        wq, wg = rearrange(wq, "(h two d) e -> two (h d) e", h=h, two=2)
        bq, bg = (None, None) if bq is None else rearrange(bq, "(h two d) -> two (h d)", h=h, two=2)
    else:
        wg, bg = _gate_weights(module, spec, h)
    d = wq.shape[0] // h if spec.head_dim is None else int(resolve(module, spec.head_dim, spec.name))
    if wq.shape[0] != h * d or wk.shape[0] % g or wv.shape[0] % g or wk.shape[0] // g != d:
        raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: projections of "
                              f"{wq.shape[0]}/{wk.shape[0]}/{wv.shape[0]} outputs do not split into {h} query heads "
                              f"and {g} key/value heads of size {d}")
    dv = wv.shape[0] // g
    sinks = None if spec.sinks is None else resolve(module, spec.sinks, spec.name).detach().double().reshape(-1)
    if sinks is not None and sinks.shape[0] != h:
        raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: {spec.sinks!r} holds "
                              f"{sinks.shape[0]} sink logits, expected one per query head ({h})")
    if wg is not None and wg.shape[0] not in (h, h * dv):
        raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: the output gate has "
                              f"{wg.shape[0]} outputs, expected one per head ({h}) or per feature ({h * dv})")
    if spec.grouping == "r g" and g != h:  # to canonical (g r) order
        wq = rearrange(wq, "(r g d) e -> (g r d) e", g=g, d=d)
        bq = None if bq is None else rearrange(bq, "(r g d) -> (g r d)", g=g, d=d)
        if wo is not None:
            wo = rearrange(wo, "o (r g dv) -> o (g r dv)", g=g, dv=dv)
        sinks = None if sinks is None else rearrange(sinks, "(r g) -> (g r)", g=g)
        if wg is not None:
            wg = rearrange(wg, "(r g n) e -> (g r n) e", g=g, r=h // g)
            bg = None if bg is None else rearrange(bg, "(r g n) -> (g r n)", g=g, r=h // g)
    scale = 1.0 / math.sqrt(d) if spec.scale is None else float(
        spec.scale if isinstance(spec.scale, float | int) else resolve(module, spec.scale, spec.name))
    return Weights(wq, wk, wv, wo, bq, bk, bv, bo, h, g, d, dv, scale, wg=wg, bg=bg, sinks=sinks)


def _gate_weights(module: Any, spec: ModuleSpec, h: int) -> tuple[Tensor | None, Tensor | None]:
    """The output gate's projection ``(wg, bg)`` in the module's head order, its per-head bias (Beam's) spread over
    each head's gate outputs; ``(None, None)`` without a gate (or a gate chunked from the query projection)."""
    if spec.gate is None or spec.gate.in_query or resolve(module, spec.gate.proj, spec.name) is None:
        return None, None
    wg, bg = _linear(module, spec.gate.proj, spec)
    if spec.gate.bias is not None:
        per_head = resolve(module, spec.gate.bias, spec.name).detach().double().reshape(-1)
        spread = repeat(per_head, "h -> (h n)", n=wg.shape[0] // h)
        bg = spread if bg is None else bg + spread
    return wg, bg


def _full_rank_query(module: Any, lat: Latent) -> Any:
    """The full-rank query projection of a latent attention module, or None: low-rank (``q_a``/``q_b``), whether the
    class sets ``q_proj = None`` (DeepSeek V3 with ``q_lora_rank``) or has no such attribute (DeepSeek V3.2)."""
    try:
        return resolve(module, lat.q, "latent")
    except AuditUsageError:
        return None


def latent_weights(module: Any, spec: ModuleSpec) -> Weights:
    """A latent attention module's sizes (``h`` heads of ``nope + rope`` query/key features and ``value`` value
    features, one key/value head per query head) and output projection. Its queries, keys and values are not linear
    in ``x`` (RMSNorms inside): the reference computes them with :func:`latent_projections`; ``wq``, ``wk`` and ``wv``
    are the linear maps with those norms left out, kept only for their shapes."""
    assert spec.latent is not None
    lat, name = spec.latent, spec.name
    h = int(resolve(module, spec.num_heads, name))
    nope, rope, dv, rank = (int(resolve(module, path, name)) for path in (lat.nope, lat.rope, lat.value, lat.rank))
    q_full = _full_rank_query(module, lat)
    wq = (_linear(module, lat.q, spec)[0] if q_full is not None
          else _linear(module, lat.q_b, spec)[0] @ _linear(module, lat.q_a, spec)[0])
    wa, wb = _linear(module, lat.kv_a, spec)[0], _linear(module, lat.kv_b, spec)[0]
    kv = rearrange(wb @ wa[:rank], "(h n) e -> h n e", h=h)
    wk = rearrange(torch.cat([kv[:, :nope], wa[rank:][None].expand(h, rope, wa.shape[1])], dim=1), "h d e -> (h d) e")
    wo, bo = (None, None) if spec.out is None else _linear(module, spec.out, spec)
    scale = 1.0 / math.sqrt(nope + rope) if spec.scale is None else float(
        spec.scale if isinstance(spec.scale, float | int) else resolve(module, spec.scale, name))
    # an output gate on a latent module (Ling's BailingHybrid): its projection, as for a linear one
    wg, bg = _gate_weights(module, spec, h)
    return Weights(wq, wk, rearrange(kv[:, nope:], "h n e -> (h n) e"), wo, None, None, None, bo, h, h, nope + rope,
                   dv, scale, wg=wg, bg=bg)


def latent_projections(module: Any, spec: ModuleSpec) -> Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]:
    """``project(x (b, t, e)) -> (q (b, h, t, d), k (b, h, t, d), v (b, h, t, dv))`` of a latent attention module
    (:class:`Latent`), before the rotary embedding, in ``x``'s dtype (the norms in float64, as :func:`_norm`)."""
    assert spec.latent is not None
    lat, name = spec.latent, spec.name
    h = int(resolve(module, spec.num_heads, name))
    nope, rank = int(resolve(module, lat.nope, name)), int(resolve(module, lat.rank, name))
    full = _full_rank_query(module, lat) is not None
    layers = {path: _linear(module, path, spec) for path in ((lat.q,) if full else (lat.q_a, lat.q_b))
              + (lat.kv_a, lat.kv_b)}
    kv_norm, q_norm = _norm(module, lat.kv_norm, spec), None if full else _norm(module, lat.q_norm, spec)

    def lin(z: Tensor, path: str) -> Tensor:
        weight, bias = layers[path]
        y = einsum(z, weight.to(z.dtype), "b t e, o e -> b t o")
        return y if bias is None else y + bias.to(z.dtype)

    def norm(f: Callable[[Tensor], Tensor] | None, z: Tensor) -> Tensor:
        assert f is not None
        return f(z[:, None])[:, 0]  # the norm works on (b, h, t, d): one "head"

    def project(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q = lin(x, lat.q) if full else lin(norm(q_norm, lin(x, lat.q_a)), lat.q_b)
        compressed = lin(x, lat.kv_a)
        kv = rearrange(lin(norm(kv_norm, compressed[..., :rank]), lat.kv_b), "b s (h n) -> b h s n", h=h)
        k_rope = repeat(compressed[..., rank:], "b s r -> b h s r", h=h)
        return (rearrange(q, "b t (h d) -> b h t d", h=h), torch.cat([kv[..., :nope], k_rope], dim=-1),
                kv[..., nope:])

    return project


def _split_groups(w: Tensor, g: int, r: int) -> tuple[Tensor, Tensor, Tensor]:
    """Rows ``(g [q_1 .. q_r k v] d)`` of a fused projection as ``[q (g r d); k (g d); v (g d)]``."""
    parts = rearrange(w, "(g n d) e -> g n d e", g=g, n=r + 2)
    return (rearrange(parts[:, :r], "g r d e -> (g r d) e"), rearrange(parts[:, r], "g d e -> (g d) e"),
            rearrange(parts[:, r + 1], "g d e -> (g d) e"))


def _norm(module: Any, path: str, spec: ModuleSpec) -> Callable[[Tensor], Tensor] | None:
    """The reference of a q/k norm module at ``path``: LayerNorm when it has a bias (or is ``nn.LayerNorm``),
    else RMSNorm, over each head's last axis, with its weight and ``eps``/``variance_epsilon``; float64 math.
    None when the attribute is None, or missing with a path ending in ``?`` (Phi without ``qk_layernorm``)."""
    optional = path.endswith("?")
    path = path.removesuffix("?")
    try:
        layer = resolve(module, path, spec.name)
    except AuditUsageError:
        if optional:
            return None
        raise
    if layer is None:
        return None
    weight, bias = getattr(layer, "weight", None), getattr(layer, "bias", None)
    if weight is None and isinstance(getattr(layer, "scale", None), Tensor):  # torchtune's RMSNorm calls it scale
        weight = layer.scale
    eps = getattr(layer, "eps", getattr(layer, "variance_epsilon", None))
    if eps is None:
        raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: the norm {path!r} "
                              f"({type(layer).__name__}) has no eps or variance_epsilon")
    layer_norm = isinstance(layer, nn.LayerNorm) or isinstance(bias, Tensor)
    w = None if weight is None else weight.detach().double()
    b = None if bias is None else bias.detach().double()
    try:  # Gemma's RMSNorm scales by (1 + weight), its weight initialised at zero
        if w is not None and "1.0 + self.weight" in inspect.getsource(type(layer).forward):
            w = 1.0 + w
    except (OSError, TypeError):
        pass

    def norm(x: Tensor) -> Tensor:
        y = x.double()
        whole = w is not None and w.ndim == 1 and w.shape[-1] != y.shape[-1]  # OLMo-2: over every head, (h d)
        if whole:
            y = rearrange(y, "b h t d -> b t (h d)")
        if layer_norm:
            y = y - y.mean(dim=-1, keepdim=True)
        y = y * torch.rsqrt(y.pow(2).mean(dim=-1, keepdim=True) + float(eps))
        if w is not None:  # a (h, d) weight: one per head (Chameleon)
            y = y * (w[:, None] if w.ndim == 2 else w)
        if b is not None:
            y = y + (b[:, None] if b.ndim == 2 else b)
        if whole:
            y = rearrange(y, "b t (h d) -> b h t d", h=x.shape[1])
        return y.to(x.dtype)

    return norm
