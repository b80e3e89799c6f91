"""The spec of x-transformers' ``Attention`` and its options."""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from einops import rearrange, repeat
from torch import Tensor, nn

from ..core.conventions import Conventions
from ..modules.spec import ModuleSpec, Weights
from ..modules.variants import OutputGate
from ..modules.weights import spec_weights


def _x_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
               is_causal: bool) -> Tensor:
    if keep is not None and keep.shape[1] > 1:  # x-transformers reads (b, h, t, s) masks in its (r g) order
        keep = rearrange(keep, "b (g r) t s -> b (r g) t s", g=m.kv_heads)
    # causal=None keeps the module's own flag (forward's causal=False would switch off a causal=True module's mask,
    # which its spec declares always_causal, as its model calls it)
    out = m(x, attn_mask=keep, causal=True if is_causal else None)
    result: Tensor = out[0] if isinstance(out, tuple) else out
    return result


def _x_l2norm(groups: int, gain: Tensor | None) -> Callable[[Tensor], Tensor]:
    """x-transformers' ``qk_norm``: each head's features in ``groups`` groups, each scaled to unit l2 norm
    (``F.normalize``: ``x / max(|x|, 1e-12)``), times the learned per-head gain when ``qk_norm_dim_scale``."""

    def norm(x: Tensor) -> Tensor:
        y: Tensor = rearrange(x.double(), "b h t (n d) -> b h t n d", n=groups)
        y = rearrange(y / y.norm(dim=-1, keepdim=True).clamp_min(1e-12), "b h t n d -> b h t (n d)")
        return (y if gain is None else y * gain).to(x.dtype)

    return norm


def _x_norms(m: Any) -> dict[str, Callable[[Tensor], Tensor]]:
    if not m.qk_norm:
        return {}
    q_gain = k_gain = None
    if m.qk_norm_dim_scale:  # (h, 1, d) in x-transformers' (r g) head order, to ours
        q_gain = rearrange(m.qk_norm_q_scale.detach().double(), "(r g) one d -> (g r) one d", g=m.kv_heads)
        k_gain = m.qk_norm_k_scale.detach().double()
    return {"q": _x_l2norm(m.qk_norm_groups, q_gain), "k": _x_l2norm(m.qk_norm_groups, k_gain)}


def _x_weights(m: Any) -> Weights:
    """The projections (queries in x-transformers' ``(r g)`` head order, turned to ours), the memory key/values
    (``num_mem_kv``) and ``add_zero_kv``'s zero position as always-visible extra positions, the per-head output
    scales (``head_scale``) folded into ``to_out``."""
    w = spec_weights(m, dataclasses.replace(X_TRANSFORMERS, weights=None))
    extra_k, extra_v = [], []
    if getattr(m, "num_mem_kv", 0):
        extra_k.append(rearrange(m.mem_k.detach().double(), "g n d -> n (g d)"))
        extra_v.append(rearrange(m.mem_v.detach().double(), "g n d -> n (g d)"))
    if getattr(m.attend, "add_zero_kv", False):
        extra_k.append(torch.zeros(1, w.g * w.d, dtype=torch.float64))
        extra_v.append(torch.zeros(1, w.g * w.dv, dtype=torch.float64))
    wo = w.wo
    if getattr(m, "head_scale", False) and wo is not None:
        scales = rearrange(m.head_scale_params.detach().double().flatten(), "(r g) -> (g r)", g=w.g)
        wo = wo * repeat(scales, "h -> (h dv)", dv=w.dv)[None]
    weights: Weights = dataclasses.replace(w, wo=wo, extra_k=torch.cat(extra_k) if extra_k else None,
                                           extra_v=torch.cat(extra_v) if extra_v else None)
    return weights


#: the x-transformers options the spec models: read back from an instance to build its twin with only them
_X_MODELLED = ("causal", "qk_norm", "qk_norm_groups", "qk_norm_dim_scale", "head_scale")
#: attributes of an instance whose option has another name
_X_OPTION_OF = {"attend.pre_softmax_talking_heads": "pre_talking_heads",
                "attend.post_softmax_talking_heads": "post_talking_heads", "to_v_gate": "gate_values",
                "to_output_gate": "output_gate", "mem_k": "num_mem_kv", "mem_v": "num_mem_kv",
                "head_scale_params": "head_scale", "attend.attn_fn": "sigmoid / hard / gumbel_softmax / ...",
                "to_latent_q": "use_latent_q", "to_latent_kv": "use_latent_kv", "q_rmsnorm": "qk_rmsnorm",
                "k_rmsnorm": "qk_rmsnorm / k_rmsnorm", "value_rmsnorm": "value_rmsnorm"}


def _x_state(m: nn.Module) -> dict[str, str]:
    """What an x-transformers ``Attention`` was built with, as it keeps it: each plain attribute (numbers, flags,
    strings, the attention function's name and options) and each parameter's shape, by dotted name."""

    state = {f"{name}": str(tuple(p.shape)) for name, p in m.named_parameters()}
    for prefix, sub in m.named_modules():
        for key, value in vars(sub).items():
            if isinstance(value, functools.partial):
                value = (getattr(value.func, "__name__", "?"), sorted(value.keywords.items()))
            if not key.startswith("_") and key != "training" and isinstance(value, bool | int | float | str | tuple):
                state[f"{prefix}.{key}".lstrip(".")] = str(value)
    return state


def _x_unmodelled(m: Any) -> list[str]:
    """The options ``m`` was built with that the ``x_transformers`` spec does not model: its state against the
    state of a twin built with only the modelled options (sizes, heads, causal, qk norm, the value-head gate)."""
    dim_head = m.to_q.out_features // m.heads
    twin = type(m)(m.to_q.in_features, dim_head=dim_head, heads=m.heads, kv_heads=m.kv_heads,
                   dim_context=m.to_k.in_features, value_dim_head=m.to_v.out_features // m.kv_heads,
                   dim_out=m.to_out.out_features, gate_value_heads=m.to_v_head_gate is not None,
                   qk_norm_scale=m.qk_norm_scale, flash=m.attend.flash, dropout=m.attend.dropout,
                   add_zero_kv=m.attend.add_zero_kv,
                   **{name: getattr(m, name) for name in _X_MODELLED})
    ours, theirs = _x_state(m), _x_state(twin)
    options: dict[str, str] = {}
    for name in sorted(ours.keys() | theirs.keys()):
        if ours.get(name) == theirs.get(name):
            continue
        owner = next((option for attribute, option in _X_OPTION_OF.items()
                      if name == attribute or name.startswith(f"{attribute}.")), None)
        key = owner or name.removeprefix("attend.")
        options.setdefault(key, key if owner or name not in ours else f"{key}={ours[name]}")
    if len(options) > 1:  # the attention function changes with the option that chose it: name that option
        options.pop(_X_OPTION_OF["attend.attn_fn"], None)
    return list(options.values())


X_TRANSFORMERS = ModuleSpec(
    "x_transformers", _x_forward, Conventions(self_attention=True, fully_masked="zero"),
    q="to_q", k="to_k", v="to_v", out="to_out", num_heads="heads", num_kv_heads="kv_heads", scale="attend.scale",
    grouping="r g", build=lambda cls, config: cls(**config), norms=_x_norms, unmodelled=_x_unmodelled,
    weights=_x_weights,
    gate=OutputGate("to_v_head_gate"), module_type="x_transformers.x_transformers.Attention")


# ----------------------------------------------------------------------------------------------------
# x-transformers
# ----------------------------------------------------------------------------------------------------

def x_transformers_spec(module: Any) -> ModuleSpec:
    """x-transformers' ``Attention``: the shipped ``x_transformers`` spec (grouped key/value heads in its ``(r g)``
    order, value heads of their own size, a context of another width, memory key/values, ``add_zero_kv``, per-head
    output scales, q/k norms, the value-head gate), always causal when built with ``causal=True``. Every other
    option is refused by name before any check (the spec's ``unmodelled``)."""
    from .x_transformers import X_TRANSFORMERS

    conventions = X_TRANSFORMERS.conventions
    if getattr(module, "causal", False):
        conventions = dataclasses.replace(conventions, always_causal=True)
    return dataclasses.replace(X_TRANSFORMERS, conventions=conventions)
