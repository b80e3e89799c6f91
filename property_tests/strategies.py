"""The property suite's strategies are the public ones: :mod:`typed_transformer.strategies` (no private copy).

This module only re-exports them, so that ``from property_tests.strategies import ...`` keeps working.
"""

from typed_transformer.strategies import (
    MASK_LAYOUTS,
    MAX_SEED,
    TORCH_RANDOM,
    AttentionInputs,
    AttentionShape,
    MaskLayout,
    MHAConfig,
    additive_masks,
    attention_inputs,
    attention_shapes,
    attn_masks,
    float_dtypes,
    keep_masks,
    key_padding_masks,
    mask_shape,
    mha_configs,
    randn,
    randomize_parameters,
    seeds,
)

__all__ = [
    "MASK_LAYOUTS",
    "MAX_SEED",
    "TORCH_RANDOM",
    "AttentionInputs",
    "AttentionShape",
    "MHAConfig",
    "MaskLayout",
    "additive_masks",
    "attention_inputs",
    "attention_shapes",
    "attn_masks",
    "float_dtypes",
    "keep_masks",
    "key_padding_masks",
    "mask_shape",
    "mha_configs",
    "randn",
    "randomize_parameters",
    "seeds",
]
