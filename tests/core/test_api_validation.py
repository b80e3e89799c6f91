"""Bad API inputs of issue 13 (point 9): each refused at the call with an error naming the argument, instead of a
ZeroDivisionError, an IndexError, a silently wrong value or an obscure TypeError deep inside torch."""

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.support.properties import exactly
from typed_transformer import GPT, GPTConfig, MultiHeadAttention, ShapeError, scaled_dot_product_attention


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


# ---------------------------------------------------------------------------------------------------
# Generation: any positive temperature, and logits that are not finite
# ---------------------------------------------------------------------------------------------------


def _tiny_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=7, block_size=6, n_layer=1, n_head=2, n_embd=8)).eval()


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-40])
def test_a_tiny_temperature_samples_the_argmax(temperature: float) -> None:
    model = _tiny_gpt()
    prompt = torch.tensor([[1, 2], [3, 4]])
    greedy = model.generate(prompt, 5, greedy=True)
    for seed in range(3):
        drawn = model.generate(prompt, 5, temperature=temperature, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(drawn, greedy)  # the limit of softmax(logits / T) as T -> 0


def test_a_tiny_temperature_shares_the_draw_between_tied_maxima() -> None:
    from typed_transformer.gpt import sample

    logits = torch.tensor([[2.0, 2.0, -1.0, 1.999]]).expand(400, 4)
    drawn = sample(logits, temperature=1e-300, generator=torch.Generator().manual_seed(0))[:, 0]
    counts = torch.bincount(drawn, minlength=4)
    assert counts[2] == counts[3] == 0
    assert 140 < counts[0] < 260
    assert counts[0] + counts[1] == 400


def _nan_model() -> GPT:
    model = _tiny_gpt()
    with torch.no_grad():
        model.ln_f.weight[3] = float("nan")
    return model


@pytest.mark.parametrize("settings", [{}, {"greedy": True}, {"top_k": 2, "top_p": 0.5},
                                      {"lengths": torch.tensor([2, 1])}])
def test_generation_from_nan_weights_names_the_weight(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=exactly(
            "GPT.generate: the model's logits hold NaN or infinity, so no token can be drawn: its weight "
            "ln_f.weight holds NaN or infinity")) as info:
        _nan_model().generate(torch.tensor([[1, 2], [0, 3]]), 3, **settings)
    assert info.type is ValueError


def test_generation_from_exploded_finite_weights_says_they_are_finite() -> None:
    model = _tiny_gpt()
    with torch.no_grad():
        model.tok_emb.weight.mul_(1e30)  # finite, but the activations overflow
    with pytest.raises(ValueError, match="^" + re.escape("GPT.generate: the model's logits hold NaN or infinity, so no "
                                                         "token can be drawn: its weights are finite but so large")):
        model.generate(torch.tensor([[1]]), 2)


def test_sample_refuses_logits_that_are_not_finite() -> None:
    from typed_transformer.gpt import sample

    for bad in (float("nan"), float("inf"), None):
        logits = torch.zeros(3, 4)
        logits[0, 1] = -float("inf")  # a token that is never drawn: allowed
        if bad is None:
            logits[1] = -float("inf")
        else:
            logits[1, 2] = bad
        for greedy in (False, True):
            with pytest.raises(ValueError, match=exactly("sample: logits row 1 holds NaN or +inf, or only -inf: no "
                                                         "token can be drawn from it")):
                sample(logits, greedy=greedy)


# ---------------------------------------------------------------------------------------------------
# Head size 0, integer dtypes for modules, losses over no position
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("scale", [None, 1.0])
def test_a_head_size_of_zero_is_a_shape_error_naming_q(backend: str, scale: float | None) -> None:
    q = torch.randn(1, 2, 3, 0)
    v = torch.randn(1, 2, 3, 4)
    with pytest.raises(ShapeError) as info:
        scaled_dot_product_attention(q, q, v, scale=scale, backend=backend)  # type: ignore[call-overload]
    assert info.type is ShapeError
    assert str(info.value).splitlines()[0] == ("typed_transformer.attention.scaled_dot_product_attention(): q: axis d "
                                               "is 0: the head size must be at least 1")
    assert (info.value.argument, info.value.axis, info.value.actual) == ("q", "d", 0)


DTYPE_MESSAGE = ("{owner}: dtype must be None or a floating-point dtype (torch.float32, torch.float64, torch.float16 "
                 "or torch.bfloat16), got {dtype!r}")


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64, "float32"])
def test_modules_refuse_a_parameter_dtype_that_is_not_floating_point(dtype: Any) -> None:
    from typed_transformer import Seq2SeqTransformer
    from typed_transformer.layers import FeedForward, Transformer, TransformerDecoderLayer, TransformerEncoderLayer
    from typed_transformer.positions import LearnedPositionalEmbedding

    builds: dict[str, Callable[[], object]] = {
        "MultiHeadAttention": lambda: MultiHeadAttention(32, 4, dtype=dtype),
        "FeedForward": lambda: FeedForward(8, 16, dtype=dtype),
        "TransformerEncoderLayer": lambda: TransformerEncoderLayer(8, 2, 16, dtype=dtype),
        "TransformerDecoderLayer": lambda: TransformerDecoderLayer(8, 2, 16, dtype=dtype),
        "Transformer": lambda: Transformer(8, 2, 1, 1, 16, dtype=dtype),
        "Seq2SeqTransformer": lambda: Seq2SeqTransformer(5, 5, 0, 0, d_model=8, nhead=2, dtype=dtype),
        "LearnedPositionalEmbedding": lambda: LearnedPositionalEmbedding(4, 8, dtype=dtype),
    }
    for owner, build in builds.items():
        with pytest.raises(ValueError, match=exactly(DTYPE_MESSAGE.format(owner=owner, dtype=dtype))) as info:
            build()
        assert info.type is ValueError


def test_floating_point_dtypes_still_build_in_that_dtype() -> None:
    for dtype in (torch.float64, torch.float16, torch.bfloat16, None):
        attention = MultiHeadAttention(32, 4, dtype=dtype)
        assert {p.dtype for p in attention.parameters()} == {dtype or torch.get_default_dtype()}


@pytest.mark.parametrize(("shape", "axis"), [((1, 0), "t"), ((0, 3), "b")])
def test_the_loss_over_no_position_is_a_shape_error(shape: tuple[int, int], axis: str) -> None:
    model = _tiny_gpt()
    ids = torch.zeros(shape, dtype=torch.long)
    with pytest.raises(ShapeError) as info:
        model(ids, ids)
    assert info.type is ShapeError
    assert str(info.value).splitlines()[0] == (f"typed_transformer.gpt.GPT.forward(): targets: axis {axis} is 0: the "
                                               f"loss needs at least one position")


def test_a_loss_whose_targets_are_all_ignored_is_refused() -> None:
    model = _tiny_gpt()
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with pytest.raises(ValueError, match=exactly("GPT.forward: targets are all -1 (ignored): the mean loss over no "
                                                 "position is undefined; give at least one target id")) as info:
        model(ids, torch.full_like(ids, -1))
    assert info.type is ValueError
    targets = torch.full_like(ids, -1)
    targets[1, 2] = 4  # one position counts: the loss is its cross-entropy
    logits, loss = model(ids, targets)
    assert loss is not None
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits[1, 2][None], torch.tensor([4])))
