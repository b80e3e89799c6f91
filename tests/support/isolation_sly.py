"""A candidate whose module patches ``math.sqrt`` when it is imported (never import it in a test process: it is
audited by name, in its own process, where the patch stays)."""

import math

import torch.nn.functional as F
from torch import Tensor

_real_sqrt = math.sqrt
math.sqrt = lambda x: 1.0 if isinstance(x, int) else _real_sqrt(x)  # the import-time patch


def no_scale_behind_a_patched_sqrt(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                                   is_causal: bool = False) -> Tensor:
    """No 1/sqrt(d) at all; the module made ``math.sqrt(int)`` answer 1.0 when it was imported, so a reference that
    takes its scale from ``math.sqrt`` in the same process would agree."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=1.0)
