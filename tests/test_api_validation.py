"""Bad API inputs of issue 13 (point 9): each refused at the call with an error naming the argument, instead of a
ZeroDivisionError, an IndexError, a silently wrong value or an obscure TypeError deep inside torch."""

import re
from typing import Any

import pytest
import torch

from typed_transformer import GPT, GPTConfig, MultiHeadAttention, ShapeError, scaled_dot_product_attention


def exactly(message: str) -> str:
    return "^" + re.escape(message) + "$"


def test_zero_key_value_heads_is_a_shape_error_naming_k() -> None:
    q = torch.randn(1, 4, 3, 8)
    k = torch.randn(1, 0, 3, 8)
    with pytest.raises(ShapeError) as info:
        scaled_dot_product_attention(q, k, k)
    assert info.type is ShapeError
    assert "k: axis g is 0: need at least one key/value head" in str(info.value)
    with pytest.raises(ValueError, match=exactly("MultiHeadAttention: num_kv_heads must be a positive int, got 0")):
        MultiHeadAttention(32, 4, num_kv_heads=0)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_scale_is_refused(scale: float) -> None:
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match=exactly(f"scaled_dot_product_attention: scale must be a finite number, "
                                                 f"got {scale}")):
        scaled_dot_product_attention(q, q, q, scale=scale)


def test_finite_scales_still_work_and_match_torch() -> None:
    q, k, v = (torch.randn(1, 2, 3, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    for scale in (0.0, -0.5, 3.0):
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)
        torch.testing.assert_close(scaled_dot_product_attention(q, k, v, scale=scale), expected)


def test_generate_with_an_empty_prompt_is_a_shape_error_naming_idx() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=8)).eval()
    with pytest.raises(ShapeError) as info:
        model.generate(torch.zeros(1, 0, dtype=torch.long), 3)
    assert "idx: axis t is 0: generation needs a prompt of at least one token" in str(info.value)
    assert model.generate(torch.zeros(1, 1, dtype=torch.long), 3).shape == (1, 4)  # one token is enough


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"bias": "no"}, "GPTConfig: bias must be True or False, got 'no'"),
        ({"bias": 1}, "GPTConfig: bias must be True or False, got 1"),
        ({"tie_weights": "false"}, "GPTConfig: tie_weights must be True or False, got 'false'"),
        ({"tie_weights": None}, "GPTConfig: tie_weights must be True or False, got None"),
        ({"layer_norm_eps": -1.0}, "GPTConfig: layer_norm_eps must be a positive finite number, got -1.0"),
        ({"layer_norm_eps": 0.0}, "GPTConfig: layer_norm_eps must be a positive finite number, got 0.0"),
        ({"layer_norm_eps": float("nan")}, "GPTConfig: layer_norm_eps must be a positive finite number, got nan"),
        ({"layer_norm_eps": float("inf")}, "GPTConfig: layer_norm_eps must be a positive finite number, got inf"),
        ({"layer_norm_eps": "1e-5"}, "GPTConfig: layer_norm_eps must be a positive finite number, got '1e-5'"),
        ({"dropout": float("nan")}, "GPTConfig: dropout must be in [0, 1), got nan"),
        ({"n_kv_heads": 1.0}, "GPTConfig: n_kv_heads must be None or a positive int, got 1.0"),
    ],
)
def test_gpt_config_refuses_values_of_the_wrong_type_or_range(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=exactly(message)) as info:
        GPTConfig(vocab_size=5, n_head=2, n_embd=8, **overrides)
    assert info.type is ValueError


def test_gpt_config_accepts_real_booleans_and_a_small_eps() -> None:
    config = GPTConfig(vocab_size=5, n_head=2, n_embd=8, bias=True, tie_weights=False, layer_norm_eps=1e-12)
    model = GPT(config)
    assert model.ln_f.eps == 1e-12
    assert model.ln_f.bias is not None
    assert model.lm_head.weight is not model.tok_emb.weight


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((32.0, 4), "MultiHeadAttention: d_model must be a positive int, got 32.0"),
        (("32", 4), "MultiHeadAttention: d_model must be a positive int, got '32'"),
        ((32, "4"), "MultiHeadAttention: num_heads must be a positive int, got '4'"),
        ((32, 4.0), "MultiHeadAttention: num_heads must be a positive int, got 4.0"),
    ],
)
def test_multihead_attention_sizes_must_be_ints(args: tuple[Any, Any], message: str) -> None:
    with pytest.raises(ValueError, match=exactly(message)) as info:
        MultiHeadAttention(*args)
    assert info.type is ValueError
