"""typed-transformer: a reference Transformer in PyTorch with runtime-checked tensor shapes.

Every public function and ``forward`` is annotated with jaxtyping shapes (``Float[Tensor, "b h t d"]``)
and checked at the call; a wrong shape raises :class:`ShapeError` (a ``jaxtyping.TypeCheckError``)
naming the function, the argument, the axis and both sizes.

Modules, in dependency order: ``shapecheck`` -> ``masks`` -> ``attention`` -> ``positions`` -> ``multihead``
-> ``layers`` -> ``seq2seq`` / ``gpt`` -> ``hf`` / ``tutorial``, ``data`` -> ``checkpoint`` -> ``training`` -> ``cli``.
"""

from jaxtyping import TypeCheckError

# threads first reads torch's thread count here, so a torch.set_num_threads made after this import is the user's.
from . import hf, interop, threads, tutorial
from .attention import scaled_dot_product_attention, scaled_dot_product_attention_with_weights
from .gpt import GPT, GPTConfig
from .interop import from_torch, to_torch
from .layers import (
    FeedForward,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from .masks import (
    attn_mask_from_torch,
    attn_mask_to_torch,
    causal_mask,
    key_padding_mask_from_torch,
    key_padding_mask_to_torch,
    merge_causal,
    merge_masks,
)
from .multihead import KVCache, MultiHeadAttention
from .plot import plot_attention
from .positions import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from .seq2seq import Seq2SeqTransformer
from .shapecheck import (
    ShapeError,
    checks_enabled,
    is_checked,
    set_shape_checks,
    set_strict_checks,
    shape_checks,
    shape_trace,
    strict_checks,
    strict_checks_enabled,
)
from .validation import TokenIdError

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "FeedForward",
    "GPTConfig",
    "KVCache",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "RotaryEmbedding",
    "Seq2SeqTransformer",
    "ShapeError",
    "SinusoidalPositionalEncoding",
    "TokenIdError",
    "Transformer",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
    "TypeCheckError",
    "attn_mask_from_torch",
    "attn_mask_to_torch",
    "causal_mask",
    "checks_enabled",
    "from_torch",
    "hf",
    "interop",
    "is_checked",
    "key_padding_mask_from_torch",
    "key_padding_mask_to_torch",
    "merge_causal",
    "merge_masks",
    "plot_attention",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_with_weights",
    "set_shape_checks",
    "set_strict_checks",
    "shape_checks",
    "shape_trace",
    "strict_checks",
    "strict_checks_enabled",
    "threads",
    "to_torch",
    "tutorial",
]
