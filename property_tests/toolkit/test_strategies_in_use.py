"""The property suite draws its inputs from the public strategies (typed_transformer.strategies), the ones users get."""

from property_tests.core import test_attention_properties, test_multihead_properties
from typed_transformer.strategies import attention_shapes, keep_masks, mha_configs


def test_property_suite_uses_the_public_strategies() -> None:
    assert vars(test_attention_properties)["attention_shapes"] is attention_shapes
    assert vars(test_multihead_properties)["mha_configs"] is mha_configs
    assert vars(test_attention_properties)["keep_masks"] is keep_masks
