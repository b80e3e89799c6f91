"""Feed-forward, encoder/decoder layers and stacks: hand formulas, torch interop, torch's quirks, errors."""

import copy
import inspect
import math
import re
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from tests.support.properties import exactly, mha_fastpath
from tests.support.properties import seeded_randn as randn
from typed_transformer import ShapeError, causal_mask, from_torch, key_padding_mask_to_torch, to_torch
from typed_transformer.layers import (
    FeedForward,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from typed_transformer.multihead import MultiHeadAttention
from typed_transformer.positions import RotaryEmbedding

M = TypeVar("M", bound=nn.Module)

# torch warns that its nested tensors are a prototype whenever eval + no_grad takes the nested path.
pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")


def close(actual: Tensor, expected: Tensor) -> None:
    """float64 against float64: the same sums in a different order."""
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)


def randomize(module: M, seed: int = 1) -> M:
    """Random weights everywhere (torch initialises biases to 0 and LayerNorm to 1, which hides bugs)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float64) * 0.5)
    return module


def quiet_torch(build: Callable[[], nn.Module]) -> nn.Module:
    """Build a torch module without its warning that the nested-tensor path cannot be used."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
        return build()


# ----------------------------------------------------------------------------------------------------
# Feed-forward and LayerNorm, against the formulas
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("activation", "formula"),
    [
        ("relu", lambda h: torch.clamp(h, min=0.0)),
        ("gelu", lambda h: 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))),
        ("gelu_tanh", lambda h: 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)))),
        (torch.sigmoid, torch.sigmoid),
    ],
)
def test_feed_forward_is_the_papers_equation(activation: object, formula: Callable[[Tensor], Tensor]) -> None:
    ff = randomize(FeedForward(6, 10, activation=activation, dtype=torch.float64))  # type: ignore[arg-type]
    assert isinstance(ff, FeedForward)
    x = randn(2, 3, 6)
    want = formula(x @ ff.linear1.weight.T + ff.linear1.bias) @ ff.linear2.weight.T + ff.linear2.bias
    close(ff(x), want)


def test_layer_norm_is_torchs_biased_variance_with_eps_inside_the_root() -> None:
    layer = randomize(TransformerEncoderLayer(6, 2, 8, 0.0, layer_norm_eps=1e-3, dtype=torch.float64))
    assert isinstance(layer, TransformerEncoderLayer)
    x = randn(2, 3, 6)
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    want = (x - mean) / torch.sqrt(var + 1e-3) * layer.norm1.weight + layer.norm1.bias
    close(layer.norm1(x), want)
    # The Annotated Transformer's LayerNorm (unbiased std, eps outside the root) is a different function.
    annotated = (x - mean) / (x.std(dim=-1, keepdim=True) + 1e-3) * layer.norm1.weight + layer.norm1.bias
    assert (layer.norm1(x) - annotated).abs().max() > 1e-2


def test_post_ln_and_pre_ln_encoder_layers_follow_their_equations() -> None:
    x = randn(2, 4, 6)
    for norm_first in (False, True):
        layer = randomize(TransformerEncoderLayer(6, 2, 8, 0.0, norm_first=norm_first, dtype=torch.float64))
        assert isinstance(layer, TransformerEncoderLayer)

        def sa(y: Tensor, layer: TransformerEncoderLayer = layer) -> Tensor:
            out: Tensor = layer.self_attn(y)[0]
            return out

        if norm_first:
            h = x + sa(layer.norm1(x))
            want = h + layer.feed_forward(layer.norm2(h))
        else:
            h = layer.norm1(x + sa(x))
            want = layer.norm2(h + layer.feed_forward(h))
        close(layer(x), want)


# ----------------------------------------------------------------------------------------------------
# Torch interop: every module, both directions, both layer-norm placements, activations, bias
# ----------------------------------------------------------------------------------------------------

OPTIONS = [
    {"norm_first": False, "activation": "relu", "bias": True},
    {"norm_first": True, "activation": "gelu", "bias": True},
    {"norm_first": False, "activation": "gelu", "bias": False},
    {"norm_first": True, "activation": "relu", "bias": False},
]


def _src_masks() -> tuple[Tensor, Tensor]:
    padding = torch.tensor([[True, True, True, True, True], [True, True, True, False, False]])
    return padding, key_padding_mask_to_torch(padding)


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("batch_first", [True, False])
def test_encoder_layer_from_torch_and_back(options: dict[str, object], batch_first: bool) -> None:
    theirs = randomize(nn.TransformerEncoderLayer(6, 2, 8, 0.0, batch_first=batch_first, dtype=torch.float64,
                                                  **options)).eval()  # type: ignore[arg-type]
    assert isinstance(theirs, nn.TransformerEncoderLayer)
    ours = from_torch(theirs)
    x = randn(2, 5, 6)
    padding, torch_padding = _src_masks()
    with mha_fastpath(False):
        want = theirs(x if batch_first else rearrange(x, "b s d -> s b d"), src_mask=~causal_mask(5),
                      src_key_padding_mask=torch_padding)
    want = want if batch_first else rearrange(want, "s b d -> b s d")
    close(ours(x, src_key_padding_mask=padding, is_causal=True), want)
    back = to_torch(ours, batch_first=batch_first)
    assert back.state_dict().keys() == theirs.state_dict().keys()
    for key, value in theirs.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key
    assert not back.training


@pytest.mark.parametrize("options", OPTIONS)
def test_decoder_layer_from_torch_and_back(options: dict[str, object]) -> None:
    theirs = randomize(nn.TransformerDecoderLayer(6, 3, 8, 0.0, batch_first=True, dtype=torch.float64,
                                                  **options)).eval()  # type: ignore[arg-type]
    assert isinstance(theirs, nn.TransformerDecoderLayer)
    ours = from_torch(theirs)
    tgt, memory = randn(2, 4, 6, seed=1), randn(2, 5, 6, seed=2)
    padding, torch_padding = _src_masks()
    want = theirs(tgt, memory, tgt_mask=~causal_mask(4), memory_key_padding_mask=torch_padding)
    got = ours(tgt, memory, memory_key_padding_mask=padding, tgt_is_causal=True)
    close(got, want)
    back = to_torch(ours)
    for key, value in theirs.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key


@pytest.mark.parametrize("options", OPTIONS)
def test_transformer_from_torch_and_back(options: dict[str, object]) -> None:
    torch.manual_seed(0)
    theirs = quiet_torch(lambda: nn.Transformer(6, 2, 2, 2, 8, 0.0, batch_first=True, dtype=torch.float64,
                                                **options))  # type: ignore[arg-type]
    randomize(theirs).eval()
    assert isinstance(theirs, nn.Transformer)
    ours = from_torch(theirs)
    src, tgt = randn(2, 5, 6, seed=1), randn(2, 4, 6, seed=2)
    padding, torch_padding = _src_masks()
    with torch.no_grad():  # eval + no_grad: torch may take its nested-tensor path
        want = theirs(src, tgt, tgt_mask=~causal_mask(4), src_key_padding_mask=torch_padding,
                      memory_key_padding_mask=torch_padding)
    got = ours(src, tgt, src_key_padding_mask=padding, memory_key_padding_mask=padding, tgt_is_causal=True)
    close(got, want)
    back = to_torch(ours)
    assert back.state_dict().keys() == theirs.state_dict().keys()
    for key, value in theirs.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key


def test_state_dict_names_are_torchs_up_to_two_renames() -> None:
    """Ours = torch's names, except the feed-forward's linears live in ``feed_forward`` and the fused
    projection is a Linear (``in_proj.weight`` for torch's ``in_proj_weight``)."""
    theirs = quiet_torch(lambda: nn.Transformer(6, 2, 1, 1, 8))
    assert isinstance(theirs, nn.Transformer)
    ours = from_torch(theirs)
    renamed = {key.replace("feed_forward.", "").replace("in_proj.weight", "in_proj_weight")
               .replace("in_proj.bias", "in_proj_bias") for key in ours.state_dict()}
    assert renamed == set(theirs.state_dict())


def test_stacks_from_torch_keep_each_layer_and_the_final_norm() -> None:
    layer = nn.TransformerDecoderLayer(6, 2, 8, 0.0, batch_first=True, dtype=torch.float64)
    theirs = randomize(nn.TransformerDecoder(layer, 3, norm=nn.LayerNorm(6, dtype=torch.float64)))
    assert isinstance(theirs, nn.TransformerDecoder)
    ours = from_torch(theirs)
    assert len(ours.layers) == 3
    tgt, memory = randn(2, 4, 6), randn(2, 3, 6, seed=1)
    close(ours(tgt, memory), theirs(tgt, memory))
    no_norm = from_torch(nn.TransformerDecoder(layer, 1))
    assert no_norm.norm is None


@pytest.mark.parametrize("activation", ["gelu_tanh", nn.GELU(approximate="tanh")], ids=["name", "module"])
def test_gelu_tanh_keeps_torch_off_its_exact_gelu_fast_path(activation: Any) -> None:
    """torch's fast path treats any nn.GELU as exact GELU; to_torch hands over a plain function instead,
    so the torch copy computes tanh-GELU on every path."""
    ours = randomize(TransformerEncoderLayer(6, 2, 8, 0.0, activation=activation, dtype=torch.float64)).eval()
    assert isinstance(ours, TransformerEncoderLayer)
    theirs = to_torch(ours)
    x = randn(2, 5, 6)
    with torch.no_grad(), mha_fastpath(True):
        close(theirs(x), ours(x))
    assert from_torch(theirs).feed_forward.extra_repr() == "activation=gelu_tanh"


# ----------------------------------------------------------------------------------------------------
# torch's quirks, documented by tests
# ----------------------------------------------------------------------------------------------------


def test_torch_nested_path_zeroes_padded_positions_and_we_do_not() -> None:
    layer = nn.TransformerEncoderLayer(6, 2, 8, 0.0, batch_first=True, dtype=torch.float64)
    theirs = randomize(nn.TransformerEncoder(layer, 2)).eval()
    assert isinstance(theirs, nn.TransformerEncoder)
    ours = from_torch(theirs)
    x = randn(2, 5, 6)
    padding, torch_padding = _src_masks()
    with torch.no_grad():
        want = theirs(x, src_key_padding_mask=torch_padding)
    got = ours(x, src_key_padding_mask=padding)
    close(got[padding], want[padding])
    assert torch.equal(want[1, 3:], torch.zeros(2, 6, dtype=torch.float64))  # torch's nested tensor: zeros
    assert got[1, 3:].abs().min() > 0  # ours: ordinary values (a padded query still attends to real keys)


def test_torch_fused_encoder_layer_reads_a_float_mask_as_boolean() -> None:
    """pytorch/pytorch#118628: in eval + no_grad torch's fused encoder layer treats every non-zero entry of
    an additive float mask as "masked out". Ours adds the mask to the logits, as torch's slow path does."""
    theirs = randomize(nn.TransformerEncoderLayer(6, 2, 8, 0.0, batch_first=True, dtype=torch.float64)).eval()
    assert isinstance(theirs, nn.TransformerEncoderLayer)
    ours = from_torch(theirs)
    x = randn(2, 3, 6)
    bias = torch.tensor([[0.0, 1.5, 0.0], [0.0, 0.0, -2.0], [0.5, 0.0, 0.0]], dtype=torch.float64)
    as_boolean = torch.zeros_like(bias).masked_fill(bias != 0, float("-inf"))
    with torch.no_grad():
        fused = theirs(x, src_mask=bias)
        with mha_fastpath(False):
            slow, slow_boolean = theirs(x, src_mask=bias), theirs(x, src_mask=as_boolean)
    close(fused, slow_boolean)
    assert (fused - slow).abs().max() > 1e-3
    close(ours(x, bias), slow)


def test_nn_transformer_builds_final_norms_and_final_norms_false_leaves_them_out() -> None:
    """With post-LN, nn.Transformer's decoder output goes through two LayerNorms in a row (pytorch#24930)."""
    torch.manual_seed(0)
    theirs = quiet_torch(lambda: nn.Transformer(6, 2, 1, 1, 8, 0.0))
    assert isinstance(theirs, nn.Transformer)
    assert theirs.encoder.norm is not None
    assert theirs.decoder.norm is not None
    ours = Transformer(6, 2, 1, 1, 8, 0.0)
    assert isinstance(ours.encoder.norm, nn.LayerNorm)
    assert isinstance(ours.decoder.norm, nn.LayerNorm)
    bare = Transformer(6, 2, 1, 1, 8, 0.0, final_norms=False)
    assert bare.encoder.norm is None
    assert bare.decoder.norm is None
    assert not any("encoder.norm." in key or "decoder.norm." in key for key in bare.state_dict())
    # The same weights with and without the final norms: the decoder output differs by exactly that norm.
    bare.load_state_dict({k: v for k, v in ours.state_dict().items() if "coder.norm." not in k})
    src, tgt = torch.randn(2, 3, 6), torch.randn(2, 4, 6)
    memory = ours.encoder(src)
    torch.testing.assert_close(ours(src, tgt), ours.decoder.norm(bare.decoder(tgt, memory)))


def test_layers_start_identical_in_a_stack_but_not_in_transformer() -> None:
    encoder = TransformerEncoder(TransformerEncoderLayer(6, 2, 8), 2)
    first, second = encoder.layers[0].state_dict(), encoder.layers[1].state_dict()
    assert all(torch.equal(first[key], second[key]) for key in first)  # deep copies, as in torch
    model = Transformer(6, 2, 2, 2, 8)
    first, second = model.encoder.layers[0].state_dict(), model.encoder.layers[1].state_dict()
    assert not torch.equal(first["feed_forward.linear1.weight"], second["feed_forward.linear1.weight"])


def test_is_causal_is_a_real_flag() -> None:
    """torch's ``is_causal`` is a hint that needs the mask as well; ours alone is enough."""
    layer = randomize(TransformerEncoderLayer(6, 2, 8, 0.0, dtype=torch.float64))
    x = randn(2, 4, 6)
    with_flag, with_mask = layer(x, is_causal=True), layer(x, causal_mask(4))
    torch.testing.assert_close(with_flag, with_mask, rtol=0, atol=0)
    assert (with_flag - layer(x)).abs().max() > 1e-3
    theirs = to_torch(layer)
    with pytest.raises(RuntimeError):
        theirs(x, is_causal=True)


# ----------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------


def test_wrong_widths_batches_and_masks_raise_shape_errors() -> None:
    model = Transformer(8, 2, 1, 1, 16)
    src, tgt = torch.randn(2, 5, 8), torch.randn(2, 4, 8)
    with pytest.raises(ShapeError) as info:
        model(torch.randn(2, 5, 6), tgt)
    assert (info.value.argument, info.value.axis, info.value.actual, info.value.expected) == ("src", "d_model", 6, 8)
    with pytest.raises(ShapeError) as info:
        model(src, tgt[:1])
    assert (info.value.argument, info.value.axis, info.value.bound_by) == ("tgt", "b", "src")
    with pytest.raises(ShapeError) as info:
        model(src, tgt, tgt_mask=torch.ones(4, 5, dtype=torch.bool))
    assert (info.value.argument, info.value.axis) == ("tgt_mask", "t")
    with pytest.raises(ShapeError) as info:
        model(src, tgt, memory_key_padding_mask=torch.ones(2, 4, dtype=torch.bool))
    assert (info.value.argument, info.value.axis) == ("memory_key_padding_mask", "s")
    with pytest.raises(ShapeError) as info:
        model.encoder(src, src_key_padding_mask=torch.ones(2, 5))
    assert info.value.argument == "src_key_padding_mask"
    with pytest.raises(ShapeError) as info:
        model.decoder.layers[0](tgt, torch.randn(2, 5, 7))
    assert (info.value.argument, info.value.axis, info.value.expected) == ("memory", "d_model", 8)
    with pytest.raises(ShapeError) as info:
        FeedForward(8, 16)(torch.randn(2, 3, 4))
    assert (info.value.argument, info.value.axis) == ("x", "d_model")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TransformerEncoderLayer(10, 4), "d_model=10 is not divisible by nhead=4"),
        (lambda: TransformerDecoderLayer(8, 2, 0), "dim_feedforward must be a positive int, got 0"),
        (lambda: TransformerEncoderLayer(8, 0), "nhead must be a positive int, got 0"),
        (lambda: TransformerEncoderLayer(8, 2, dropout=1.0), r"dropout must be in \[0, 1\), got 1.0"),
        (lambda: TransformerEncoderLayer(8, 2, layer_norm_eps=0.0), "layer_norm_eps must be a finite number > 0"),
        (lambda: FeedForward(8, 16, activation="silu"),  # type: ignore[arg-type]
         "activation must be 'relu', 'gelu', 'gelu_tanh' or a callable, got 'silu'"),
        (lambda: TransformerEncoder(TransformerEncoderLayer(8, 2), 0), "num_layers must be a positive int, got 0"),
        (lambda: Transformer(8, 2, custom_encoder=TransformerEncoder(TransformerEncoderLayer(4, 2), 1)),
         "custom_encoder.d_model=4 does not match d_model=8"),
    ],
)
def test_constructors_reject_bad_arguments(build: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_interop_refuses_what_it_cannot_convert() -> None:
    with pytest.raises(TypeError, match=r"^from_torch: expected one of nn\.MultiheadAttention, .*, got Linear$"):
        from_torch(nn.Linear(2, 2))  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="convert torch's with from_torch"):
        TransformerEncoder(nn.TransformerEncoderLayer(8, 2), 2)  # type: ignore[arg-type]
    rotary = TransformerEncoderLayer(8, 2, rotary=RotaryEmbedding(4))
    with pytest.raises(ValueError, match="no rotary embeddings"):
        to_torch(rotary)


def test_repr_and_copies() -> None:
    layer = TransformerDecoderLayer(8, 2, 16, norm_first=True)
    assert repr(layer).startswith("TransformerDecoderLayer(\n  d_model=8, nhead=2, norm_first=True")
    assert "FeedForward(\n    activation=relu" in repr(layer)
    clone = copy.deepcopy(layer)
    x, memory = torch.randn(1, 2, 8), torch.randn(1, 3, 8)
    layer.eval()
    clone.eval()
    torch.testing.assert_close(clone(x, memory), layer(x, memory))
    assert F.relu is layer.feed_forward.activation


def test_feed_forward_repr_names_known_activations_and_shows_other_callables() -> None:
    assert FeedForward(4, 8, activation=torch.nn.GELU(approximate="tanh")).extra_repr() == "activation=gelu_tanh"
    assert FeedForward(4, 8, activation=torch.nn.functional.gelu).extra_repr() == "activation=gelu"
    assert FeedForward(4, 8, activation=torch.nn.GELU()).extra_repr() == "activation=gelu"
    assert FeedForward(4, 8, activation=torch.nn.ReLU()).extra_repr() == "activation=relu"
    assert FeedForward(4, 8, activation=torch.tanh).extra_repr() == f"activation={torch.tanh!r}"
    assert FeedForward(4, 8, activation=torch.nn.SiLU()).extra_repr() == "activation=SiLU()"


def every_attention(module: nn.Module) -> list[MultiHeadAttention]:
    return [m for m in module.modules() if isinstance(m, MultiHeadAttention)]


def test_from_torch_hands_the_backend_to_every_attention() -> None:
    layer = nn.TransformerEncoderLayer(6, 2, 8, 0.0, batch_first=True)
    decoder_layer = nn.TransformerDecoderLayer(6, 2, 8, 0.0, batch_first=True)
    converted: list[nn.Module] = [
        from_torch(layer, backend="reference"),
        from_torch(decoder_layer, backend="reference"),
        from_torch(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), backend="reference"),
        from_torch(nn.TransformerDecoder(decoder_layer, 2), backend="reference"),
        from_torch(cast(nn.Transformer, quiet_torch(lambda: nn.Transformer(6, 2, 1, 1, 8))),
                               backend="reference"),
    ]
    for module in converted:
        attentions = every_attention(module)
        assert attentions
        assert {a.backend for a in attentions} == {"reference"}, type(module).__name__
    assert {a.backend for a in every_attention(from_torch(layer))} == {"sdpa"}


@pytest.mark.parametrize("cls", [TransformerEncoderLayer, TransformerDecoderLayer, TransformerEncoder,
                                 TransformerDecoder, Transformer])
def test_the_deprecated_classmethods_name_what_they_expected_and_got(cls: Any) -> None:
    expected = "nn." + cls.__name__
    with (pytest.warns(DeprecationWarning, match=f"^{cls.__name__}.from_torch is deprecated"),
          pytest.raises(TypeError, match=f"^from_torch: expected {re.escape(expected)}, got Linear$")):
        cls.from_torch(nn.Linear(2, 2))


def test_to_torch_refuses_rotary_with_its_reason() -> None:
    with pytest.raises(ValueError, match=exactly("to_torch: torch's Transformer layers have no rotary embeddings "
                                                "(rotary is set)")):
        to_torch(TransformerEncoderLayer(8, 2, rotary=RotaryEmbedding(4)))


def test_to_torch_copies_share_no_tensor_and_warn_nothing() -> None:
    norm = nn.LayerNorm(6)
    # norm_first: torch then warns that it cannot use its nested-tensor path; to_torch knows and keeps quiet
    stacks: list[Any] = [TransformerEncoder(TransformerEncoderLayer(6, 2), 2, norm),
                         TransformerEncoder(TransformerEncoderLayer(6, 2, norm_first=True), 2, norm),
                         TransformerDecoder(TransformerDecoderLayer(6, 2), 2, norm), Transformer(6, 2, 1, 1, 8)]
    for ours in stacks:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            theirs = to_torch(ours)
        assert caught == [], [str(w.message) for w in caught]
        our_storage = {p.untyped_storage().data_ptr() for p in ours.parameters()}
        assert not any(p.untyped_storage().data_ptr() in our_storage for p in theirs.parameters())
        assert sum(p.numel() for p in theirs.parameters()) == sum(p.numel() for p in ours.parameters())
    transformer = Transformer(6, 3, 1, 1, 8)
    assert (to_torch(transformer).nhead, to_torch(transformer).d_model) == (3, 6)


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: FeedForward(0, 4), ValueError, "FeedForward: d_model must be a positive int, got 0"),
        (lambda: FeedForward(4, 0), ValueError, "FeedForward: dim_feedforward must be a positive int, got 0"),
        (lambda: FeedForward(4, 4, dropout=1.0), ValueError, "FeedForward: dropout must be in [0, 1), got 1.0"),
        (lambda: FeedForward(4, 4, activation="silu"), ValueError,  # type: ignore[arg-type]
         "FeedForward: activation must be 'relu', 'gelu', 'gelu_tanh' or a callable, got 'silu'"),
        (lambda: TransformerEncoderLayer(0, 2), ValueError, "TransformerEncoderLayer: d_model must be a positive int, "
                                                            "got 0"),
        (lambda: TransformerEncoderLayer(8, True), ValueError,
         "TransformerEncoderLayer: nhead must be a positive int, got True"),
        (lambda: TransformerEncoderLayer(8, 2, layer_norm_eps=0.0), ValueError,
         "TransformerEncoderLayer: layer_norm_eps must be a finite number > 0, got 0.0"),
        (lambda: TransformerEncoderLayer(8, 2, dropout=1.0), ValueError,
         "TransformerEncoderLayer: dropout must be in [0, 1), got 1.0"),
        (lambda: TransformerDecoderLayer(8, 3), ValueError,
         "TransformerDecoderLayer: d_model=8 is not divisible by nhead=3"),
        (lambda: TransformerEncoder(TransformerEncoderLayer(8, 2), 0), ValueError,
         "TransformerEncoder: num_layers must be a positive int, got 0"),
        (lambda: TransformerDecoder(TransformerDecoderLayer(8, 2), True), ValueError,
         "TransformerDecoder: num_layers must be a positive int, got True"),
        (lambda: TransformerEncoder(nn.TransformerEncoderLayer(8, 2), 1), TypeError,  # type: ignore[arg-type]
         "TransformerEncoder: encoder_layer must be a typed_transformer TransformerEncoderLayer, got "
         "TransformerEncoderLayer (convert torch's with from_torch)"),
        (lambda: TransformerDecoder(nn.TransformerDecoderLayer(8, 2), 1),  # type: ignore[arg-type]
         TypeError,
         "TransformerDecoder: decoder_layer must be a typed_transformer TransformerDecoderLayer, got "
         "TransformerDecoderLayer (convert torch's with from_torch)"),
    ],
)
def test_constructor_errors_name_the_class_the_argument_and_the_value(build: Callable[[], object],
                                                                      error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=exactly(message)):
        build()


@pytest.mark.parametrize(("ours", "theirs"), [(TransformerEncoderLayer, nn.TransformerEncoderLayer),
                                               (TransformerDecoderLayer, nn.TransformerDecoderLayer),
                                               (Transformer, nn.Transformer)])
def test_defaults_are_torchs(ours: Any, theirs: Any) -> None:
    """Every argument both constructors have defaults to the same value (the paper's base model for
    nn.Transformer: 512 wide, 8 heads, 6 + 6 layers, 2048, dropout 0.1), and so do the forward flags."""
    for method in ("__init__", "forward"):
        our_params = inspect.signature(getattr(ours, method)).parameters
        their_params = inspect.signature(getattr(theirs, method)).parameters
        shared = [name for name in our_params if name in their_params and name != "self"
                  and their_params[name].default is not inspect.Parameter.empty]
        assert len(shared) >= 3, (ours, method)
        for name in shared:
            theirs_default = their_params[name].default
            theirs_default = "relu" if theirs_default is F.relu else theirs_default  # the same activation
            if theirs_default is None and name.endswith("is_causal"):
                theirs_default = False  # torch's None = "guess from the mask"; ours is a real flag, off
            assert our_params[name].default == theirs_default, (ours.__name__, method, name)


def has_bias(linear: nn.Linear) -> bool:
    return linear.bias is not None


def test_options_reach_every_sublayer() -> None:
    rotary = RotaryEmbedding(4)
    encoder = TransformerEncoderLayer(8, 2, 16, dropout=0.3, layer_norm_eps=1e-3, bias=False, rotary=rotary,
                                      backend="reference")
    decoder = TransformerDecoderLayer(8, 2, 16, dropout=0.3, layer_norm_eps=1e-3, bias=False, rotary=rotary,
                                      backend="reference")
    for layer in (encoder, decoder):
        ff = layer.feed_forward
        assert ff.dropout.p == 0.3
        assert not has_bias(ff.linear1)
        assert not has_bias(ff.linear2)
        assert (ff.dim_feedforward, ff.linear1.out_features) == (16, 16)
        norms = [m for m in layer.modules() if isinstance(m, nn.LayerNorm)]
        assert len(norms) == (2 if layer is encoder else 3)
        assert all(n.eps == 1e-3 and n.bias is None for n in norms)
        dropouts = [m.p for name, m in layer.named_children() if name.startswith("dropout")]
        assert dropouts == [0.3] * len(dropouts)
        assert len(dropouts) == len(norms)
        assert layer.self_attn.rotary is rotary
    for attention in every_attention(encoder) + every_attention(decoder):
        assert (attention.dropout, attention.backend) == (0.3, "reference")
        assert not has_bias(attention.out_proj)
    assert decoder.multihead_attn.rotary is None  # positions are for self-attention only


def test_stacks_copy_the_layer_and_share_nothing() -> None:
    for stack in (TransformerEncoder(TransformerEncoderLayer(8, 2, 16), 3),
                  TransformerDecoder(TransformerDecoderLayer(8, 2, 16), 3)):
        storages = [p.untyped_storage().data_ptr() for p in stack.parameters()]
        assert len(storages) == len(set(storages)) == 3 * len(list(stack.layers[0].parameters()))


def test_default_construction_is_torchs_base_model() -> None:
    """The defaults at work (the signature test above sees the source, not what runs)."""
    layer = TransformerEncoderLayer(8, 2)
    decoder_layer = TransformerDecoderLayer(8, 2)
    for built in (layer, decoder_layer):
        assert built.feed_forward.dim_feedforward == 2048
        assert built.feed_forward.dropout.p == 0.1
        assert built.feed_forward.extra_repr() == "activation=relu"
        assert not built.norm_first
        assert all(n.eps == 1e-5 and n.bias is not None for n in built.modules() if isinstance(n, nn.LayerNorm))
        assert has_bias(built.feed_forward.linear1)
        assert {a.backend for a in every_attention(built)} == {"sdpa"}
    model = Transformer()
    assert (model.d_model, model.nhead, len(model.encoder.layers), len(model.decoder.layers)) == (512, 8, 6, 6)
    first = model.encoder.layers[0]
    assert isinstance(first, TransformerEncoderLayer)
    assert (first.feed_forward.dim_feedforward, first.feed_forward.dropout.p, first.norm_first) == (2048, 0.1, False)
    assert has_bias(first.feed_forward.linear1)
    for norm in (model.encoder.norm, model.decoder.norm):
        assert isinstance(norm, nn.LayerNorm)
        assert norm.eps == 1e-5
        assert norm.bias is not None


def test_decoder_layer_is_not_causal_unless_asked() -> None:
    layer = randomize(TransformerDecoderLayer(6, 2, 8, 0.0, dtype=torch.float64)).eval()
    tgt, memory = randn(2, 4, 6), randn(2, 3, 6, seed=1)
    assert torch.equal(layer(tgt, memory), layer(tgt, memory, tgt_is_causal=False))
    assert not torch.allclose(layer(tgt, memory), layer(tgt, memory, tgt_is_causal=True))


def test_transformer_final_norms_follow_eps_and_bias() -> None:
    model = Transformer(8, 2, 1, 1, 16, layer_norm_eps=1e-3, bias=False)
    for norm in (model.encoder.norm, model.decoder.norm):
        assert isinstance(norm, nn.LayerNorm)
        assert norm.eps == 1e-3
        assert norm.bias is None


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"custom_encoder": "decoder"}, "Transformer: custom_encoder must be a typed_transformer TransformerEncoder, got "
                                    "TransformerDecoder"),
    ({"custom_decoder": "encoder"}, "Transformer: custom_decoder must be a typed_transformer TransformerDecoder, got "
                                    "TransformerEncoder"),
])
def test_transformer_refuses_swapped_custom_stacks(kwargs: dict[str, str], message: str) -> None:
    stacks: dict[str, Any] = {"encoder": TransformerEncoder(TransformerEncoderLayer(8, 2, 16), 1),
                              "decoder": TransformerDecoder(TransformerDecoderLayer(8, 2, 16), 1)}
    with pytest.raises(TypeError, match=exactly(message)):
        Transformer(8, 2, 1, 1, 16, **{key: stacks[value] for key, value in kwargs.items()})
    with pytest.raises(ValueError, match=r"^Transformer: custom_encoder.d_model=8 does not match d_model=4$"):
        Transformer(4, 2, 1, 1, 16, custom_encoder=stacks["encoder"])


def test_from_torch_copies_dropout_and_norms_without_sharing_them() -> None:
    encoder_layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.3, batch_first=True)
    decoder_layer = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.3, batch_first=True)
    for ours in (from_torch(encoder_layer), from_torch(decoder_layer)):
        dropouts = [m.p for m in ours.modules() if isinstance(m, nn.Dropout)]
        assert dropouts == [0.3] * len(dropouts)
        assert len(dropouts) >= 3
    norm = nn.LayerNorm(8)
    theirs_stacks: list[Any] = [nn.TransformerEncoder(encoder_layer, 1, norm, enable_nested_tensor=False),
                                nn.TransformerDecoder(decoder_layer, 1, norm)]
    for theirs in theirs_stacks:
        converted = from_torch(theirs)
        assert converted.norm is not theirs.norm
        assert converted.norm.weight.untyped_storage().data_ptr() != theirs.norm.weight.untyped_storage().data_ptr()
        assert torch.equal(converted.norm.weight, theirs.norm.weight)


def test_activation_must_be_a_name_or_a_callable() -> None:
    with pytest.raises(ValueError, match=exactly("FeedForward: activation must be 'relu', 'gelu', 'gelu_tanh' or "
                                                "a callable, got 3")):
        FeedForward(4, 4, activation=3)  # type: ignore[arg-type]


def test_to_torch_is_batch_first_by_default() -> None:
    encoder_layer, decoder_layer = TransformerEncoderLayer(8, 2, 16), TransformerDecoderLayer(8, 2, 16)
    converted: list[Any] = [to_torch(encoder_layer), to_torch(decoder_layer),
                            to_torch(TransformerEncoder(encoder_layer, 1)),
                            to_torch(TransformerDecoder(decoder_layer, 1)), to_torch(Transformer(8, 2, 1, 1, 16))]
    for module in converted:
        attentions = [m for m in module.modules() if isinstance(m, nn.MultiheadAttention)]
        assert attentions
        assert all(a.batch_first for a in attentions), type(module).__name__
    assert converted[-1].batch_first


def test_transformer_names_itself_in_size_errors() -> None:
    with pytest.raises(ValueError, match=r"^Transformer: d_model=8 is not divisible by nhead=3$"):
        Transformer(8, 3, 1, 1, 16)


def test_activation_names_keep_their_earlier_import_path() -> None:
    from typing import get_args

    from typed_transformer.layers import ActivationName

    assert get_args(ActivationName) == ("relu", "gelu", "gelu_tanh")
