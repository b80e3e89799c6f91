"""typed_transformer.interop: from_torch / to_torch, the one pair of entry points between torch's modules and ours,
and the earlier spellings that keep working with a DeprecationWarning."""

import re
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import typed_transformer
from typed_transformer import (
    MultiHeadAttention,
    RotaryEmbedding,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
    from_torch,
    interop,
    to_torch,
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
IDS = [type(theirs).__name__ for theirs, _ in TORCH_MODULES]
#: The per-kind function names of the earlier API, in TORCH_MODULES' order.
KINDS = ["multihead", "encoder_layer", "decoder_layer", "encoder", "decoder", "transformer"]


def _same_parameters(a: nn.Module, b: nn.Module) -> bool:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def _shares_a_tensor(a: nn.Module, b: nn.Module) -> bool:
    pointers = {t.untyped_storage().data_ptr() for t in a.state_dict().values()}
    return any(t.untyped_storage().data_ptr() in pointers for t in b.state_dict().values())


@pytest.mark.parametrize(("theirs", "kind"), TORCH_MODULES, ids=IDS)
def test_from_torch_dispatches_on_the_type_and_to_torch_goes_back(theirs: nn.Module, kind: type[nn.Module]) -> None:
    ours: nn.Module = from_torch(theirs, backend="reference")  # type: ignore[call-overload]
    assert type(ours) is kind
    assert {m.backend for m in ours.modules() if isinstance(m, MultiHeadAttention)} == {"reference"}
    back: nn.Module = to_torch(ours)  # type: ignore[call-overload]
    assert type(back) is type(theirs)
    assert _same_parameters(back, theirs)
    assert not _shares_a_tensor(ours, theirs)
    assert not _shares_a_tensor(back, ours)


def test_the_entry_points_are_top_level_and_in_interop() -> None:
    assert typed_transformer.from_torch is interop.from_torch
    assert typed_transformer.to_torch is interop.to_torch
    assert interop.__all__ == ["from_torch", "to_torch"]


def test_from_torch_and_to_torch_name_what_they_accept() -> None:
    accepted = ("nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, "
                "nn.TransformerEncoder, nn.TransformerDecoder, nn.Transformer")
    with pytest.raises(TypeError, match=f"^{re.escape(f'from_torch: expected one of {accepted}, got Linear')}$"):
        from_torch(nn.Linear(2, 2))  # type: ignore[call-overload]
    ours = ("MultiHeadAttention, TransformerEncoderLayer, TransformerDecoderLayer, TransformerEncoder, "
            "TransformerDecoder, Transformer")
    with pytest.raises(TypeError, match=f"^{re.escape(f'to_torch: expected one of {ours}, got Linear')}$"):
        to_torch(nn.Linear(2, 2))  # type: ignore[call-overload]


def test_to_torch_refuses_what_torch_cannot_express() -> None:
    with pytest.raises(ValueError, match=r"^to_torch: nn\.MultiheadAttention has no grouped-query heads"):
        to_torch(MultiHeadAttention(8, 4, num_kv_heads=2))
    rotary = TransformerEncoderLayer(8, 2, 16, rotary=RotaryEmbedding(4))
    with pytest.raises(ValueError, match=r"^to_torch: torch's Transformer layers have no rotary embeddings"):
        to_torch(rotary)


def test_a_subclass_of_a_torch_module_converts_as_its_base() -> None:
    class TheirsToo(nn.MultiheadAttention):
        pass

    assert type(from_torch(TheirsToo(8, 2))) is MultiHeadAttention


# ----------------------------------------------------------------------------------------------------
# The earlier spellings: same results, one DeprecationWarning each, attributed to the caller's line
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("index", "kind"), list(enumerate(KINDS)), ids=KINDS)
def test_the_deprecated_functions_warn_and_convert_the_same(index: int, kind: str) -> None:
    theirs, cls = TORCH_MODULES[index]
    with pytest.warns(DeprecationWarning,
                      match=f"^typed_transformer.interop.{kind}_from_torch is deprecated, use typed_transformer."
                            "from_torch$") as caught:
        ours = getattr(interop, f"{kind}_from_torch")(theirs, backend="reference")
    assert [w.filename for w in caught] == [__file__]
    assert type(ours) is cls
    assert _same_parameters(ours, from_torch(theirs))  # type: ignore[call-overload]
    with pytest.warns(DeprecationWarning, match=f"^typed_transformer.interop.{kind}_to_torch is deprecated"):
        back = getattr(interop, f"{kind}_to_torch")(ours, batch_first=False)
    assert _same_parameters(back, to_torch(ours, batch_first=False))  # type: ignore[call-overload]
    assert type(back) is type(theirs)


def test_the_deprecated_functions_keep_their_own_refusals() -> None:
    with (pytest.warns(DeprecationWarning, match="encoder_from_torch is deprecated"),
          pytest.raises(TypeError, match=r"^from_torch: expected nn\.TransformerEncoder, got Linear$")):
        interop.encoder_from_torch(nn.Linear(2, 2))
    # one kind only: an nn.TransformerEncoder is not an nn.Transformer
    with (pytest.warns(DeprecationWarning, match="transformer_from_torch is deprecated"),
          pytest.raises(TypeError, match=r"^from_torch: expected nn\.Transformer, got TransformerEncoder$")):
        interop.transformer_from_torch(TORCH_MODULES[3][0])


@pytest.mark.parametrize(("theirs", "kind"), TORCH_MODULES, ids=IDS)
def test_the_deprecated_methods_warn_and_convert_the_same(theirs: nn.Module, kind: Any) -> None:
    with pytest.warns(DeprecationWarning,
                      match=f"^{kind.__name__}.from_torch is deprecated, use typed_transformer.from_torch$") as caught:
        ours = kind.from_torch(theirs, backend="reference")
    assert [w.filename for w in caught] == [__file__]
    assert type(ours) is kind
    assert ours.training == theirs.training
    with pytest.warns(DeprecationWarning, match=f"^{kind.__name__}.to_torch\\(\\) is deprecated"):
        back = ours.to_torch(batch_first=False)
    assert _same_parameters(back, theirs)
    assert kind.from_torch.__doc__ == "Deprecated: use :func:`typed_transformer.from_torch`."


def test_the_deprecated_classmethods_build_subclasses() -> None:
    class Mine(MultiHeadAttention):
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        copied = Mine.from_torch(nn.MultiheadAttention(8, 2))  # type: ignore[attr-defined]
    assert type(copied) is Mine


def test_the_classes_know_nothing_of_interop() -> None:
    """The deprecated methods are attached by interop: the modules that define the classes never name it."""
    from pathlib import Path

    source = Path(typed_transformer.__file__).parent
    for name in ("multihead.py", "layers.py"):
        text = (source / name).read_text(encoding="utf-8")
        assert "interop" not in text, name
        assert "def from_torch" not in text, name
        assert "def to_torch" not in text, name
