"""typed-transformer: a reference Transformer in PyTorch with runtime-checked tensor shapes.

Every public function and ``forward`` is annotated with jaxtyping shapes (``Float[Tensor, "b h t d"]``)
and checked at the call; a wrong shape raises :class:`ShapeError` (a ``jaxtyping.TypeCheckError``)
naming the function, the argument, the axis and both sizes.
"""

from jaxtyping import TypeCheckError

from .attention import scaled_dot_product_attention
from .masks import (
    attn_mask_from_torch,
    attn_mask_to_torch,
    causal_mask,
    key_padding_mask_from_torch,
    key_padding_mask_to_torch,
    merge_masks,
)
from .multihead import MultiHeadAttention
from .shapecheck import (
    ShapeError,
    checks_enabled,
    is_checked,
    set_shape_checks,
    shape_checks,
    shape_trace,
)

__version__ = "0.1.0"

__all__ = [
    "MultiHeadAttention",
    "ShapeError",
    "TypeCheckError",
    "attn_mask_from_torch",
    "attn_mask_to_torch",
    "causal_mask",
    "checks_enabled",
    "is_checked",
    "key_padding_mask_from_torch",
    "key_padding_mask_to_torch",
    "merge_masks",
    "scaled_dot_product_attention",
    "set_shape_checks",
    "shape_checks",
    "shape_trace",
]
