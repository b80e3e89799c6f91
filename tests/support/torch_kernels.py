"""torch's own attention kernels as a user audits them (docs/audit-torch-kernels.md, written by
benchmarks/audit_torch_kernels.py): ``F.scaled_dot_product_attention`` under each backend, an eager attention under
``torch.compile``, and FlexAttention behind SDPA's call (``typed_transformer.audit.flex_sdpa``)."""

import math

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel


def _sdpa(backend: SDPBackend, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool,
          enable_gqa: bool) -> Tensor:
    with sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                                enable_gqa=enable_gqa)


def sdpa_math(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False,
              enable_gqa: bool = False) -> Tensor:
    """SDPA under ``sdpa_kernel(SDPBackend.MATH)``."""
    return _sdpa(SDPBackend.MATH, q, k, v, attn_mask, is_causal, enable_gqa)


def sdpa_flash(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False,
               enable_gqa: bool = False) -> Tensor:
    """SDPA under ``sdpa_kernel(SDPBackend.FLASH_ATTENTION)`` (on the CPU: dv = d only)."""
    return _sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, attn_mask, is_causal, enable_gqa)


def sdpa_efficient(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False,
                   enable_gqa: bool = False) -> Tensor:
    """SDPA under ``sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)`` (CUDA)."""
    return _sdpa(SDPBackend.EFFICIENT_ATTENTION, q, k, v, attn_mask, is_causal, enable_gqa)


def sdpa_cudnn(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False,
               enable_gqa: bool = False) -> Tensor:
    """SDPA under ``sdpa_kernel(SDPBackend.CUDNN_ATTENTION)`` (CUDA)."""
    return _sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, attn_mask, is_causal, enable_gqa)


def _eager(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool) -> Tensor:
    """The paper's attention written in torch: half precision computed in float32, a keep-mask, bottom-right
    causal."""
    wide = torch.promote_types(q.dtype, torch.float32)
    logits = (q.to(wide) @ k.to(wide).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    t, s = q.shape[-2], k.shape[-2]
    if attn_mask is not None:
        logits = logits.masked_fill(~attn_mask, -math.inf)
    if is_causal:
        logits = logits.masked_fill(~torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t), -math.inf)
    weights = logits.softmax(-1).nan_to_num(0.0)  # a row without keys: zeros
    return (weights @ v.to(wide)).to(q.dtype)


# one graph per dtype, mask kind and causal flag: 4 x 3 x 2 = 24 > dynamo's default limit of 8, past which the calls
# would run eager and the audit would no longer see the compiled code
torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
_compiled = torch.compile(_eager, dynamic=True)


def compiled_eager(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                   is_causal: bool = False) -> Tensor:
    """``torch.compile(dynamic=True)`` of the eager attention above (compiled once per mask kind and dtype)."""
    out: Tensor = _compiled(q, k, v, attn_mask, is_causal)
    return out
