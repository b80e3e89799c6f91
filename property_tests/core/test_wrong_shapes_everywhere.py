"""Every public function and ``forward``, called with one tensor argument broken, either still fits its
annotations (jaxtyping + beartype, run independently on the same call, accept it too) or raises a
``ShapeError`` that names that argument (or the later argument that disagrees with it), in the default mode
and in strict mode. Never another exception from deep inside.

The default mode checks only the call the user makes; strict mode checks every nested call as well. Either
way the error must come from the outermost call, the one the user wrote, and point at what the user passed.
A valid call is drawn for each entry of ``CASES``; one tensor argument is then broken in one way (one axis
made larger than any size in the call, or the dtype changed to one no alternative accepts).
"""

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from jaxtyping import TypeCheckError, jaxtyped
from torch import Tensor, nn

import typed_transformer as tt
from typed_transformer.gpt import sample
from typed_transformer.shapecheck import _TYPECHECKER, ShapeError, strict_checks

Draw = Callable[[st.SearchStrategy[Any]], Any]


@dataclass
class Call:
    target: Callable[..., Any]
    function: str  # the qualified name the error must carry
    kwargs: dict[str, Any]


def small(draw: Draw, low: int = 1, high: int = 3) -> int:
    return int(draw(st.integers(low, high)))


def randn(*shape: int) -> Tensor:
    return torch.randn(*shape)


def core(draw: Draw, with_weights: bool) -> Call:
    b, g, r, t, s, d, dv = (small(draw) for _ in range(7))
    kwargs: dict[str, Any] = {"q": randn(b, g * r, t, d), "k": randn(b, g, s, d), "v": randn(b, g, s, dv)}
    if draw(st.booleans()):
        kwargs["attn_mask"] = torch.ones(b, 1, t, s, dtype=torch.bool)
    fn = tt.scaled_dot_product_attention_with_weights if with_weights else tt.scaled_dot_product_attention
    return Call(fn, f"typed_transformer.attention.{fn.__name__}", kwargs)


def mha(draw: Draw) -> Call:
    h, head, b, t, s = (small(draw) for _ in range(5))
    cross = draw(st.booleans())
    module = tt.MultiHeadAttention(h * head, h, kdim=h * head + 1 if cross else None)
    kwargs: dict[str, Any] = {"query": randn(b, t, h * head)}
    keys = t
    if cross:
        keys = s
        kwargs["key"] = randn(b, s, h * head + 1)
        kwargs["value"] = randn(b, s, h * head)
    if draw(st.booleans()):
        kwargs["attn_mask"] = torch.ones(b, h, t, keys, dtype=torch.bool)
    if draw(st.booleans()):
        kwargs["key_padding_mask"] = torch.ones(b, keys, dtype=torch.bool)
    return Call(module, "typed_transformer.multihead.MultiHeadAttention.forward", kwargs)


def layer_sizes(draw: Draw) -> tuple[int, int, int, int, int]:
    nhead, head, b, t, s = (small(draw) for _ in range(5))
    return nhead, nhead * head, b, t, s


def encoder_layer(draw: Draw, stack: bool) -> Call:
    nhead, d_model, b, _, s = layer_sizes(draw)
    layer = tt.TransformerEncoderLayer(d_model, nhead, 8, dropout=0.0)
    module: nn.Module = tt.TransformerEncoder(layer, 2) if stack else layer
    mask_name = "mask" if stack else "src_mask"
    kwargs: dict[str, Any] = {"src": randn(b, s, d_model)}
    if draw(st.booleans()):
        kwargs[mask_name] = torch.ones(s, s, dtype=torch.bool)
    if draw(st.booleans()):
        kwargs["src_key_padding_mask"] = torch.ones(b, s, dtype=torch.bool)
    name = "TransformerEncoder" if stack else "TransformerEncoderLayer"
    return Call(module, f"typed_transformer.layers.{name}.forward", kwargs)


def decoder_layer(draw: Draw, stack: bool) -> Call:
    nhead, d_model, b, t, s = layer_sizes(draw)
    layer = tt.TransformerDecoderLayer(d_model, nhead, 8, dropout=0.0)
    module: nn.Module = tt.TransformerDecoder(layer, 2) if stack else layer
    kwargs: dict[str, Any] = {"tgt": randn(b, t, d_model), "memory": randn(b, s, d_model)}
    if draw(st.booleans()):
        kwargs["tgt_mask"] = torch.ones(t, t, dtype=torch.bool)
    if draw(st.booleans()):
        kwargs["memory_mask"] = torch.ones(t, s, dtype=torch.bool)
    if draw(st.booleans()):
        kwargs["memory_key_padding_mask"] = torch.ones(b, s, dtype=torch.bool)
    name = "TransformerDecoder" if stack else "TransformerDecoderLayer"
    return Call(module, f"typed_transformer.layers.{name}.forward", kwargs)


def transformer(draw: Draw) -> Call:
    nhead, d_model, b, t, s = layer_sizes(draw)
    module = tt.Transformer(d_model, nhead, 1, 1, 8, dropout=0.0)
    kwargs: dict[str, Any] = {"src": randn(b, s, d_model), "tgt": randn(b, t, d_model)}
    if draw(st.booleans()):
        kwargs["src_key_padding_mask"] = torch.ones(b, s, dtype=torch.bool)
    if draw(st.booleans()):
        kwargs["tgt_mask"] = torch.ones(t, t, dtype=torch.bool)
    return Call(module, "typed_transformer.layers.Transformer.forward", kwargs)


def feed_forward(draw: Draw) -> Call:
    d_model, b, t = small(draw, 1, 4), small(draw), small(draw)
    return Call(tt.FeedForward(d_model, 8), "typed_transformer.layers.FeedForward.forward", {"x": randn(b, t, d_model)})


def positions(draw: Draw) -> Call:
    kind = draw(st.sampled_from(["sinusoidal", "learned", "rotary"]))
    b, t = small(draw), small(draw)
    d = 2 * small(draw)
    if kind == "rotary":
        return Call(tt.RotaryEmbedding(d), "typed_transformer.positions.RotaryEmbedding.forward",
                    {"x": randn(b, small(draw), t, d)})
    module = tt.SinusoidalPositionalEncoding(d) if kind == "sinusoidal" else tt.LearnedPositionalEmbedding(8, d)
    return Call(module, f"typed_transformer.positions.{type(module).__name__}.forward", {"x": randn(b, t, d)})


def seq2seq(draw: Draw) -> Call:
    b, t, s = small(draw), small(draw), small(draw)
    module = tt.Seq2SeqTransformer(7, 9, 0, 0, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                   dim_feedforward=8, dropout=0.0)
    src, tgt = torch.ones(b, s, dtype=torch.long), torch.ones(b, t, dtype=torch.long)
    return Call(module, "typed_transformer.seq2seq.Seq2SeqTransformer.forward", {"src": src, "tgt": tgt})


def gpt(draw: Draw) -> Call:
    b, t = small(draw), small(draw)
    config = tt.GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8)
    kwargs: dict[str, Any] = {"idx": torch.ones(b, t, dtype=torch.long)}
    if draw(st.booleans()):
        kwargs["targets"] = torch.ones(b, t, dtype=torch.long)
    return Call(tt.GPT(config), "typed_transformer.gpt.GPT.forward", kwargs)


def sampling(draw: Draw) -> Call:
    return Call(sample, "typed_transformer.gpt.sample", {"logits": randn(small(draw), small(draw, 2, 5))})


def merge(draw: Draw) -> Call:
    b, h, t, s = (small(draw) for _ in range(4))
    kwargs = {"attn_mask": torch.ones(b, h, t, s, dtype=torch.bool),
              "key_padding_mask": torch.ones(b, s, dtype=torch.bool)}
    return Call(tt.merge_masks, "typed_transformer.masks.merge_masks", kwargs)


def causal_merge(draw: Draw) -> Call:
    b, h, t, s = (small(draw) for _ in range(4))
    dtype = torch.bool if draw(st.booleans()) else torch.float32
    mask = torch.ones(small(draw, 1, 1) if draw(st.booleans()) else b, h, t, s, dtype=dtype)
    return Call(tt.merge_causal, "typed_transformer.masks.merge_causal", {"attn_mask": mask, "t": t, "s": s})


def attention_map(draw: Draw) -> Call:
    h, t, s = (small(draw) for _ in range(3))
    shape = (small(draw), h, t, s) if draw(st.booleans()) else (h, t, s)
    kwargs = {"weights": torch.rand(shape), "tokens": "q" * t, "key_tokens": "k" * s, "panel_size": 0.5, "dpi": 10}
    return Call(tt.plot_attention, "typed_transformer.plot.plot_attention", kwargs)


CASES: dict[str, Callable[[Draw], Call]] = {
    "scaled_dot_product_attention": lambda draw: core(draw, with_weights=False),
    "scaled_dot_product_attention_with_weights": lambda draw: core(draw, with_weights=True),
    "MultiHeadAttention": mha,
    "TransformerEncoderLayer": lambda draw: encoder_layer(draw, stack=False),
    "TransformerEncoder": lambda draw: encoder_layer(draw, stack=True),
    "TransformerDecoderLayer": lambda draw: decoder_layer(draw, stack=False),
    "TransformerDecoder": lambda draw: decoder_layer(draw, stack=True),
    "Transformer": transformer,
    "FeedForward": feed_forward,
    "positions": positions,
    "Seq2SeqTransformer": seq2seq,
    "GPT": gpt,
    "sample": sampling,
    "merge_masks": merge,
    "merge_causal": causal_merge,
    "plot_attention": attention_map,
}


def annotations_accept(call: Call, kwargs: dict[str, Any]) -> bool:
    """Plain ``jaxtyped(typechecker=beartype)`` on a body-less copy of the signature: the independent verdict."""
    target = call.target
    bound: tuple[Any, ...] = ()
    if isinstance(target, nn.Module):
        target, bound = type(target).forward, (target,)
    original = inspect.unwrap(target)
    hints = typing.get_type_hints(original, include_extras=True)

    def stub(*args: Any, **kwargs: Any) -> None:
        return None

    stub.__signature__ = inspect.signature(original).replace(  # type: ignore[attr-defined]
        return_annotation=inspect.Signature.empty)
    stub.__annotations__ = {k: v for k, v in hints.items() if k != "return"}
    try:
        jaxtyped(typechecker=_TYPECHECKER)(stub)(*bound, **kwargs)
    except TypeCheckError:
        return False
    return True


def _break(value: Tensor, draw: Draw, too_big: int) -> Tensor:
    """The same tensor with one axis made ``too_big`` long, or with a dtype no annotation here accepts."""
    if value.ndim and draw(st.booleans()):
        shape = list(value.shape)
        shape[draw(st.integers(0, value.ndim - 1))] = too_big
        return torch.zeros(shape, dtype=value.dtype)
    wrong = torch.float32 if value.dtype == torch.long else torch.int64
    return torch.zeros(value.shape, dtype=wrong)


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
@pytest.mark.parametrize("case", sorted(CASES))
@given(data=st.data())
def test_one_broken_argument_is_named(case: str, strict: bool, data: st.DataObject) -> None:
    with strict_checks(strict):
        call = CASES[case](data.draw)
        call.target(**call.kwargs)  # the valid call passes
        tensors = sorted(name for name, value in call.kwargs.items() if isinstance(value, Tensor))
        broken = data.draw(st.sampled_from(tensors), label="broken argument")
        too_big = 1 + max(size for value in call.kwargs.values() if isinstance(value, Tensor) for size in value.shape)
        kwargs = {**call.kwargs, broken: _break(call.kwargs[broken], data.draw, too_big + 9)}
        try:
            call.target(**kwargs)
        except ShapeError as error:
            err = error
        else:
            assert annotations_accept(call, kwargs), f"{broken}: jaxtyping rejects the call, we let it pass"
            return
    assert err.function == call.function
    # The broken argument itself, or a later one whose axis it bound (then the error says "bound by <broken>").
    assert err.argument == broken or err.bound_by == broken, (err.argument, err.bound_by, str(err))


def test_every_public_function_and_module_has_a_case() -> None:
    """A new public function or module must be added to CASES (or to the list of those without tensors)."""
    without_tensor_arguments = {"causal_mask", "KVCache"}
    torch_interop = {"attn_mask_from_torch", "attn_mask_to_torch", "key_padding_mask_from_torch",
                     "key_padding_mask_to_torch"}  # covered by tests/core/test_masks.py's exact-error tests
    covered = set(CASES) | {"SinusoidalPositionalEncoding", "LearnedPositionalEmbedding", "RotaryEmbedding"}
    for name in tt.__all__:
        obj = getattr(tt, name)
        module = inspect.isclass(obj) and issubclass(obj, nn.Module)
        checked = module or (inspect.isfunction(obj) and tt.is_checked(obj))
        if checked and name not in without_tensor_arguments | torch_interop:
            assert name in covered, name
