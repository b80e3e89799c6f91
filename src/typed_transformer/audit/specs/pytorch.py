"""The shipped spec of ``torch.nn.MultiheadAttention``: its weights, its slow path and its inference fast path."""

import math
from typing import Any

import torch
from einops import rearrange
from torch import Tensor, nn

from ..core.conventions import AuditUsageError, Conventions
from ..modules.masking import with_causal
from ..modules.spec import ModuleSpec, Options, Weights

# ----------------------------------------------------------------------------------------------------
# nn.MultiheadAttention
# ----------------------------------------------------------------------------------------------------


def _mha_weights(m: Any) -> Weights:
    if not isinstance(m, nn.MultiheadAttention):
        raise AuditUsageError(f"{type(m).__module__}.{type(m).__qualname__} does not match spec 'torch_mha': "
                              "expected a torch.nn.MultiheadAttention")
    if m._qkv_same_embed_dim:
        wq, wk, wv = m.in_proj_weight.detach().double().chunk(3)
    else:
        wq, wk, wv = (getattr(m, f"{n}_proj_weight").detach().double() for n in "qkv")
    bq, bk, bv = (None, None, None) if m.in_proj_bias is None else m.in_proj_bias.detach().double().chunk(3)
    bo = None if m.out_proj.bias is None else m.out_proj.bias.detach().double()
    d = m.embed_dim // m.num_heads
    # add_bias_kv appends bias_k/bias_v after the projected keys/values, add_zero_attn then one zero position;
    # torch pads attn_mask and key_padding_mask so that both are always visible
    extra_k = [] if m.bias_k is None else [m.bias_k.detach().double().reshape(1, -1)]
    extra_v = [] if m.bias_v is None else [m.bias_v.detach().double().reshape(1, -1)]
    if m.add_zero_attn:
        extra_k.append(torch.zeros(1, m.embed_dim, dtype=torch.float64))
        extra_v.append(torch.zeros(1, m.embed_dim, dtype=torch.float64))
    return Weights(wq, wk, wv, m.out_proj.weight.detach().double(), bq, bk, bv, bo, m.num_heads, m.num_heads, d, d,
                   1.0 / math.sqrt(d), torch.cat(extra_k) if extra_k else None,
                   torch.cat(extra_v) if extra_v else None)


def _mha_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                 is_causal: bool) -> Tensor:
    """torch's masks: True = masked out; a ``(b, 1, 1, s)`` mask goes in as ``key_padding_mask``; causality
    as an explicit ``attn_mask`` (torch's own ``is_causal`` is only a hint that such a mask is given)."""
    assert key is not None
    assert value is not None
    b, t, s = x.shape[0], x.shape[1], key.shape[1]
    attn_mask = padding = None
    if keep is not None and keep.shape[1] == 1 and keep.shape[2] == 1:
        padding, keep = ~keep[:, 0, 0], None
    keep = with_causal(keep, is_causal, t, s)
    if keep is not None:
        attn_mask = rearrange(~keep.expand(b, m.num_heads, t, s), "b h t s -> (b h) t s")
    if not m.batch_first:
        x, key, value = (rearrange(z, "b t e -> t b e") for z in (x, key, value))
    out, _ = m(x, key, value, attn_mask=attn_mask, key_padding_mask=padding, need_weights=False)
    result: Tensor = out if m.batch_first else rearrange(out, "t b e -> b t e")
    return result


def _mha_fast_path(m: Any, x: Tensor, real: Tensor) -> Tensor | None:
    """eval, no grad, batch-first self-attention (one tensor for query, key and value), key padding mask."""
    if not m._qkv_same_embed_dim or m.num_heads % 2:
        return None
    m.batch_first = True  # a copy: batch_first only decides the layout of the arguments
    with torch.no_grad():
        out, _ = m(x, x, x, key_padding_mask=~real, need_weights=False)
    result: Tensor = out
    return result


#: every constructor option of nn.MultiheadAttention: all modelled (dropout is off in the audit's eval mode)
TORCH_MHA_OPTIONS = Options(
    "torch.nn.modules.activation.MultiheadAttention",
    modelled=("embed_dim", "num_heads", "bias", "add_bias_kv", "add_zero_attn", "kdim", "vdim", "batch_first"),
    refused=(), inert=("dropout", "device", "dtype"))

TORCH_MHA = ModuleSpec(
    "torch_mha", _mha_forward, Conventions(fully_masked="zero"), weights=_mha_weights, fast_path=_mha_fast_path,
    build=lambda cls, config: cls(**config), module_type="torch.nn.modules.activation.MultiheadAttention")
