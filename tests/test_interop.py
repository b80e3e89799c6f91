"""typed_transformer.interop: one module for every conversion between torch's modules and ours."""

import re

import pytest
import torch
from torch import nn

from typed_transformer import (
    MultiHeadAttention,
    RotaryEmbedding,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
    interop,
)

torch.manual_seed(0)

TORCH_MODULES: list[tuple[nn.Module, type[nn.Module]]] = [
    (nn.MultiheadAttention(8, 2, batch_first=True), MultiHeadAttention),
    (nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True), TransformerEncoderLayer),
    (nn.TransformerDecoderLayer(8, 2, 16, 0.0, batch_first=True), TransformerDecoderLayer),
    (nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True), 2,
                           enable_nested_tensor=False), TransformerEncoder),
    (nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16, 0.0, batch_first=True), 2), TransformerDecoder),
    (nn.Transformer(8, 2, 1, 1, 16, 0.0, batch_first=True), Transformer),
]


def _same_parameters(a: nn.Module, b: nn.Module) -> bool:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


@pytest.mark.parametrize(("theirs", "kind"), TORCH_MODULES, ids=lambda x: type(x).__name__ if isinstance(x, nn.Module)
                         else x.__name__)
def test_from_torch_dispatches_and_equals_the_classmethod(theirs: nn.Module, kind: type[nn.Module]) -> None:
    ours = interop.from_torch(theirs, backend="reference")
    assert type(ours) is kind
    via_method = kind.from_torch(theirs, backend="reference")  # type: ignore[attr-defined]
    assert _same_parameters(ours, via_method)
    back = interop.to_torch(ours)
    assert type(back) is type(theirs)
    assert _same_parameters(back, theirs)
    assert _same_parameters(back, ours.to_torch())  # type: ignore[operator]


def test_from_torch_and_to_torch_name_what_they_accept() -> None:
    accepted = ("nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, "
                "nn.TransformerEncoder, nn.TransformerDecoder, nn.Transformer")
    with pytest.raises(TypeError, match=f"^{re.escape(f'from_torch: expected one of {accepted}, got Linear')}$"):
        interop.from_torch(nn.Linear(2, 2))
    ours = ("MultiHeadAttention, TransformerEncoderLayer, TransformerDecoderLayer, TransformerEncoder, "
            "TransformerDecoder, Transformer")
    with pytest.raises(TypeError, match=f"^{re.escape(f'to_torch: expected one of {ours}, got Linear')}$"):
        interop.to_torch(nn.Linear(2, 2))


def test_the_specific_functions_keep_their_refusals() -> None:
    with pytest.raises(TypeError, match=r"^from_torch: expected nn\.TransformerEncoder, got Linear$"):
        interop.encoder_from_torch(nn.Linear(2, 2))  # type: ignore[arg-type]
    gqa = MultiHeadAttention(8, 4, num_kv_heads=2)
    with pytest.raises(ValueError, match=r"^to_torch: nn\.MultiheadAttention has no grouped-query heads"):
        interop.to_torch(gqa)
    rotary = TransformerEncoderLayer(8, 2, 16, rotary=RotaryEmbedding(4))
    with pytest.raises(ValueError, match=r"^to_torch: torch's Transformer layers have no rotary embeddings"):
        interop.to_torch(rotary)


def test_the_classmethods_build_subclasses() -> None:
    class Mine(MultiHeadAttention):
        pass

    copied = Mine.from_torch(nn.MultiheadAttention(8, 2))
    assert type(copied) is Mine
