"""Properties of the Transformer stack: layers, encoder, decoder, encoder-decoder, Seq2SeqTransformer.

The reference for equivalence is torch itself (``nn.TransformerEncoderLayer``, ``nn.TransformerDecoderLayer``,
``nn.TransformerEncoder``, ``nn.TransformerDecoder``, ``nn.Transformer``) with random weights, in float64,
dropout 0, eval mode, with torch's fast paths off and on (eval + no_grad). Masks for torch are built by
hand from ours: booleans inverted, 3-D and 4-D masks laid out as ``((b h), t, s)``, bottom-right causal
masks folded in explicitly. Every mask leaves key 0 visible to every query (torch gives NaN for a query
with no key). Where torch's nested-tensor path zeroes padded positions of the encoder output, only real
positions are compared.

The other properties need no reference: decoder causality (perturbation and gradient), invariance to
padded source positions, permutation equivariance without positions (and its absence with them), the
sinusoidal formula, RoPE's relative-offset property, and decoding with a cached encoder output.
"""

import contextlib
import dataclasses
import functools
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from hypothesis import assume, given
from hypothesis import strategies as st
from torch import Tensor, nn

from tests.support.properties import EXACTISH, assert_close, bottom_right_causal, fewer_examples, mha_fastpath
from typed_transformer import ShapeError, from_torch, to_torch
from typed_transformer.layers import (
    Transformer,
)
from typed_transformer.positions import RotaryEmbedding, SinusoidalPositionalEncoding
from typed_transformer.seq2seq import Positions, Seq2SeqTransformer
from typed_transformer.strategies import (
    additive_masks,
    keep_masks,
    key_padding_masks,
    randn,
    randomize_parameters,
    seeds,
)

# torch warns that its nested tensors are a prototype whenever eval + no_grad takes the nested path.
pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")

Backend = Literal["reference", "sdpa"]
BACKENDS: tuple[Backend, ...] = ("sdpa", "reference")
POSITIONS: tuple[Positions, ...] = ("sinusoidal", "learned", "rope", "none")
ActivationName = Literal["relu", "gelu", "gelu_tanh"]


# ----------------------------------------------------------------------------------------------------
# Configurations and masks
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StackConfig:
    """Constructor arguments shared by our layers/stacks and torch's."""

    nhead: int
    head_dim: int
    dim_feedforward: int
    norm_first: bool
    activation: ActivationName
    bias: bool
    layer_norm_eps: float
    num_encoder_layers: int
    num_decoder_layers: int

    @property
    def d_model(self) -> int:
        return self.nhead * self.head_dim

    def torch_activation(self) -> str | Callable[[Tensor], Tensor]:
        # Tanh-GELU as a plain callable: torch's fast path would compute exact GELU for nn.GELU("tanh").
        if self.activation == "gelu_tanh":
            return functools.partial(F.gelu, approximate="tanh")
        return self.activation

    def torch_layer_kwargs(self, batch_first: bool) -> dict[str, Any]:
        return {"d_model": self.d_model, "nhead": self.nhead, "dim_feedforward": self.dim_feedforward,
                "dropout": 0.0, "activation": self.torch_activation(), "layer_norm_eps": self.layer_norm_eps,
                "batch_first": batch_first, "norm_first": self.norm_first, "bias": self.bias,
                "dtype": torch.float64}

    def ours(self, *, rotary: bool = False, backend: Backend = "sdpa", final_norms: bool = True) -> Transformer:
        return Transformer(self.d_model, self.nhead, self.num_encoder_layers, self.num_decoder_layers,
                           self.dim_feedforward, 0.0, activation=self.activation, layer_norm_eps=self.layer_norm_eps,
                           norm_first=self.norm_first, bias=self.bias, final_norms=final_norms,
                           rotary=RotaryEmbedding(self.head_dim) if rotary else None, backend=backend,
                           dtype=torch.float64)


@st.composite
def stack_configs(draw: st.DrawFn, *, even_head_dim: bool = False) -> StackConfig:
    """Tiny stacks: 1..4 heads of size 1..3 (2 or 4 with ``even_head_dim``, for RoPE), feed-forward width
    1..6, 1..2 layers per stack, post-LN or pre-LN, every activation, bias on or off."""
    head_dims = st.sampled_from([2, 4]) if even_head_dim else st.integers(1, 3)
    return StackConfig(
        nhead=draw(st.integers(1, 4), label="nhead"),
        head_dim=draw(head_dims, label="head_dim"),
        dim_feedforward=draw(st.integers(1, 6), label="dim_feedforward"),
        norm_first=draw(st.booleans(), label="norm_first"),
        activation=draw(st.sampled_from(["relu", "gelu", "gelu_tanh"]), label="activation"),
        bias=not draw(st.booleans(), label="no_bias"),
        layer_norm_eps=draw(st.sampled_from([1e-5, 1e-2]), label="layer_norm_eps"),
        num_encoder_layers=draw(st.integers(1, 2), label="num_encoder_layers"),
        num_decoder_layers=draw(st.integers(1, 2), label="num_decoder_layers"),
    )


@dataclass(frozen=True)
class Masks:
    """One attention's masks in our convention and, equivalently, in torch's (causal folded in)."""

    attn: Tensor | None  # ours: True = may attend, or additive float
    padding: Tensor | None  # ours: True = real token
    is_causal: bool
    torch_attn: Tensor | None  # torch's: True = masked out, or additive float; (t, s) or ((b h), t, s)
    torch_padding: Tensor | None  # torch's: True = padding, or additive float


@st.composite
def masks_for(draw: st.DrawFn, b: int, h: int, t: int, s: int, *, padding: Tensor | bool | None = True,
              causal: bool = True, finite_bias: bool = True) -> Masks:
    """Masks for an attention from ``t`` queries to ``s`` keys, each leaving key 0 visible to every query.

    ``padding``: True draws a key padding mask (or none), a tensor uses that one, False/None means none.
    ``finite_bias=False``: float masks hold only 0 and -inf. torch's fused encoder-layer path reads any
    non-zero entry of a float mask as "masked out" (pytorch/pytorch#118628), so comparisons that may take
    that path cannot use additive biases.
    """
    is_causal = causal and t <= s and draw(st.booleans(), label="is_causal")
    kind = draw(st.sampled_from(["none", "bool", "float"]), label="mask_kind")
    attn = torch_attn = None
    if kind != "none":
        layout = draw(st.sampled_from(["t s", "b t s", "b h t s"]), label="layout")
        shape = {"t s": (t, s), "b t s": (b, t, s), "b h t s": (b, h, t, s)}[layout]
        attn = draw(keep_masks(shape, always_keep=0) if kind == "bool" else additive_masks(shape, always_keep=0))
        if kind == "float" and not finite_bias:
            attn = attn.masked_fill(torch.isfinite(attn), 0.0)
        torch_attn = ~attn if kind == "bool" else attn
        if layout == "b t s":
            torch_attn = repeat(torch_attn, "b t s -> (b h) t s", h=h)
        elif layout == "b h t s":
            torch_attn = rearrange(torch_attn, "b h t s -> (b h) t s")
    if padding is True:
        padding = draw(key_padding_masks(b, s, always_keep=0)) if draw(st.booleans(), label="padded") else None
    padding_mask = padding if isinstance(padding, Tensor) else None
    torch_padding = None
    if padding_mask is not None:
        # A float attn_mask with a bool padding mask is deprecated in torch: give it a float one too.
        torch_padding = (torch.zeros(b, s, dtype=torch.float64).masked_fill(~padding_mask, float("-inf"))
                         if kind == "float" else ~padding_mask)
    if is_causal:
        hidden = ~bottom_right_causal(t, s)
        if torch_attn is None:
            torch_attn = hidden
        elif torch_attn.dtype == torch.bool:
            torch_attn = torch_attn | hidden
        else:
            torch_attn = torch_attn.masked_fill(hidden, float("-inf"))
    return Masks(attn=attn, padding=padding_mask, is_causal=is_causal, torch_attn=torch_attn,
                 torch_padding=torch_padding)


def torch_context(fastpath: bool) -> contextlib.ExitStack:
    """torch's fast paths (MHA, encoder layer, nested tensors) need eval + no_grad and the switch on."""
    stack = contextlib.ExitStack()
    stack.enter_context(mha_fastpath(fastpath))
    if fastpath:
        stack.enter_context(torch.no_grad())
    return stack


def to_torch_layout(x: Tensor, batch_first: bool) -> Tensor:
    return x if batch_first else rearrange(x, "b t d -> t b d")


def from_torch_layout(x: Tensor, batch_first: bool) -> Tensor:
    return x if batch_first else rearrange(x, "t b d -> b t d")


def quiet(build: Callable[[], nn.Module]) -> nn.Module:
    """Build a torch module without its warning that the nested-tensor path cannot be used."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
        return build()


def real_rows(x: Tensor, padding: Tensor | None) -> Tensor:
    """The positions of ``x (b, t, d)`` that hold real tokens (all of them without padding)."""
    return x if padding is None else x[padding]


# ----------------------------------------------------------------------------------------------------
# a. Equivalence with torch
# ----------------------------------------------------------------------------------------------------


@given(config=stack_configs(), b=st.integers(1, 3), s=st.integers(1, 5), batch_first=st.booleans(),
       fastpath=st.booleans(), backend=st.sampled_from(BACKENDS), data=st.data(), seed=seeds())
def test_encoder_layer_matches_torch(config: StackConfig, b: int, s: int, batch_first: bool, fastpath: bool,
                                     backend: Backend, data: st.DataObject, seed: int) -> None:
    masks = data.draw(masks_for(b, config.nhead, s, s, finite_bias=not fastpath), label="masks")
    theirs = nn.TransformerEncoderLayer(**config.torch_layer_kwargs(batch_first))
    randomize_parameters(theirs, seed).eval()
    ours = from_torch(theirs, backend=backend)
    x = randn((b, s, config.d_model), seed + 1)
    with torch_context(fastpath):
        want = theirs(to_torch_layout(x, batch_first), src_mask=masks.torch_attn,
                      src_key_padding_mask=masks.torch_padding)
    got = ours(x, masks.attn, masks.padding, masks.is_causal)
    assert_close(got, from_torch_layout(want, batch_first))


@given(config=stack_configs(), b=st.integers(1, 3), t=st.integers(1, 5), s=st.integers(1, 5),
       batch_first=st.booleans(), fastpath=st.booleans(), backend=st.sampled_from(BACKENDS), data=st.data(),
       seed=seeds())
def test_decoder_layer_matches_torch(config: StackConfig, b: int, t: int, s: int, batch_first: bool, fastpath: bool,
                                     backend: Backend, data: st.DataObject, seed: int) -> None:
    tgt_masks = data.draw(masks_for(b, config.nhead, t, t), label="tgt_masks")
    memory_masks = data.draw(masks_for(b, config.nhead, t, s), label="memory_masks")
    theirs = nn.TransformerDecoderLayer(**config.torch_layer_kwargs(batch_first))
    randomize_parameters(theirs, seed).eval()
    ours = from_torch(theirs, backend=backend)
    tgt, memory = randn((b, t, config.d_model), seed + 1), randn((b, s, config.d_model), seed + 2)
    with torch_context(fastpath):
        # torch's causal flags are hints that need the mask: the masks carry causality; the flags stay off.
        want = theirs(to_torch_layout(tgt, batch_first), to_torch_layout(memory, batch_first),
                      tgt_mask=tgt_masks.torch_attn, memory_mask=memory_masks.torch_attn,
                      tgt_key_padding_mask=tgt_masks.torch_padding, memory_key_padding_mask=memory_masks.torch_padding)
    got = ours(tgt, memory, tgt_masks.attn, memory_masks.attn, tgt_masks.padding, memory_masks.padding,
               tgt_masks.is_causal, memory_masks.is_causal)
    assert_close(got, from_torch_layout(want, batch_first))


@given(config=stack_configs(), b=st.integers(1, 3), s=st.integers(1, 5), batch_first=st.booleans(),
       fastpath=st.booleans(), final_norm=st.booleans(), data=st.data(), seed=seeds())
def test_encoder_matches_torch(config: StackConfig, b: int, s: int, batch_first: bool, fastpath: bool,
                               final_norm: bool, data: st.DataObject, seed: int) -> None:
    """Including torch's nested-tensor path (eval + no_grad + padding, no mask), which zeroes padded
    positions: there only real positions are compared."""
    masks = data.draw(masks_for(b, config.nhead, s, s, finite_bias=not fastpath), label="masks")
    layer = nn.TransformerEncoderLayer(**config.torch_layer_kwargs(batch_first))
    norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, bias=config.bias, dtype=torch.float64)
    theirs = quiet(lambda: nn.TransformerEncoder(layer, config.num_encoder_layers, norm if final_norm else None))
    randomize_parameters(theirs, seed).eval()
    assert isinstance(theirs, nn.TransformerEncoder)
    ours = from_torch(theirs)
    x = randn((b, s, config.d_model), seed + 1)
    with torch_context(fastpath):
        want = theirs(to_torch_layout(x, batch_first), mask=masks.torch_attn, src_key_padding_mask=masks.torch_padding)
    got = ours(x, masks.attn, masks.padding, masks.is_causal)
    want = from_torch_layout(want, batch_first)
    assert_close(real_rows(got, masks.padding), real_rows(want, masks.padding))
    if not fastpath:
        assert_close(got, want)


@contextlib.contextmanager
def count_encoder_layer_fast_path_calls() -> Iterator[list[int]]:
    """Count calls of ``torch._transformer_encoder_layer_fwd`` (the encoder layer's fused fast path),
    which ``nn.TransformerEncoderLayer.forward`` looks up on the ``torch`` module at call time."""
    original = torch._transformer_encoder_layer_fwd
    calls: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    torch._transformer_encoder_layer_fwd = counting
    try:
        yield calls
    finally:
        torch._transformer_encoder_layer_fwd = original


@given(config=stack_configs().filter(lambda c: c.nhead % 2 == 0 and c.bias and c.activation != "gelu_tanh"),
       b=st.integers(1, 3), s=st.integers(1, 5), nested=st.booleans(), data=st.data(), seed=seeds())
def test_encoder_matches_torch_on_its_fast_paths(config: StackConfig, b: int, s: int, nested: bool,
                                                 data: st.DataObject, seed: int) -> None:
    """Configurations torch runs on its fused encoder-layer kernel (asserted by counting calls), and, with
    right padding and no mask in post-LN, on nested tensors (asserted: torch's padded rows are exact zeros)."""
    if nested:  # what torch's nested-tensor path needs: post-LN, right padding, no attention mask
        config = dataclasses.replace(config, norm_first=False)
        lengths = torch.tensor(data.draw(st.lists(st.integers(1, s), min_size=b, max_size=b), label="lengths"))
        padding = torch.arange(s) < lengths[:, None]
        masks = Masks(attn=None, padding=padding, is_causal=False, torch_attn=None, torch_padding=~padding)
    else:
        masks = data.draw(masks_for(b, config.nhead, s, s, finite_bias=False), label="masks")
    check_encoder_on_torch_fast_path(config, b, s, masks, seed, nested=nested)


def test_encoder_fast_path_with_right_padding_drawn_without_asking_for_nested_tensors() -> None:
    """The example a CI run drew (issue 13): post-LN, right padding, no attention mask, drawn by the
    general mask strategy. torch took its nested-tensor path and returned zeros for the padded row."""
    config = StackConfig(nhead=2, head_dim=1, dim_feedforward=1, norm_first=False, activation="relu", bias=True,
                         layer_norm_eps=1e-5, num_encoder_layers=1, num_decoder_layers=1)
    padding = torch.tensor([[True, False]])
    masks = Masks(attn=None, padding=padding, is_causal=False, torch_attn=None, torch_padding=~padding)
    check_encoder_on_torch_fast_path(config, 1, 2, masks, seed=0, nested=False)


def check_encoder_on_torch_fast_path(config: StackConfig, b: int, s: int, masks: Masks, seed: int, *,
                                     nested: bool) -> None:
    layer = nn.TransformerEncoderLayer(**config.torch_layer_kwargs(batch_first=True))
    theirs = quiet(lambda: nn.TransformerEncoder(layer, config.num_encoder_layers))
    randomize_parameters(theirs, seed).eval()
    assert isinstance(theirs, nn.TransformerEncoder)
    ours = from_torch(theirs)
    x = randn((b, s, config.d_model), seed + 1)
    with torch_context(True), count_encoder_layer_fast_path_calls() as calls:
        want = theirs(x, mask=masks.torch_attn, src_key_padding_mask=masks.torch_padding)
    assert len(calls) == config.num_encoder_layers, "torch did not take its fast path: the test tests nothing"
    got = ours(x, masks.attn, masks.padding, masks.is_causal)
    if masks.padding is None:
        assert_close(got, want)
        return
    padding = masks.padding
    assert_close(got[padding], want[padding])
    # Padded positions are positions nobody reads. On its nested-tensor path torch returns exact zeros
    # there, and it takes that path whenever the masks allow it (post-LN, right padding, no attention
    # mask), whether or not the caller asked for it; otherwise its padded rows are computed like ours.
    padded_want, padded_got = want[~padding], got[~padding]
    if nested:
        assert torch.equal(padded_want, torch.zeros_like(padded_want))
    elif not torch.equal(padded_want, torch.zeros_like(padded_want)):
        assert_close(padded_got, padded_want)


@given(config=stack_configs(), b=st.integers(1, 3), s=st.integers(1, 5), t=st.integers(1, 5),
       batch_first=st.booleans(), fastpath=st.booleans(), data=st.data(), seed=seeds())
def test_transformer_matches_torch(config: StackConfig, b: int, s: int, t: int, batch_first: bool, fastpath: bool,
                                   data: st.DataObject, seed: int) -> None:
    """nn.Transformer, final norms included (two LayerNorms in a row with post-LN, as torch has them).
    The source padding mask also masks the memory, so torch's zeroed padded memory rows cannot matter
    and every target position is compared."""
    src_masks = data.draw(masks_for(b, config.nhead, s, s, finite_bias=not fastpath), label="src_masks")
    tgt_masks = data.draw(masks_for(b, config.nhead, t, t), label="tgt_masks")
    memory_masks = data.draw(masks_for(b, config.nhead, t, s, padding=src_masks.padding), label="memory_masks")
    theirs = quiet(lambda: nn.Transformer(config.d_model, config.nhead, config.num_encoder_layers,
                                          config.num_decoder_layers, **{
                                              k: v for k, v in config.torch_layer_kwargs(batch_first).items()
                                              if k not in ("d_model", "nhead")}))
    randomize_parameters(theirs, seed).eval()
    assert isinstance(theirs, nn.Transformer)
    ours = from_torch(theirs)
    src, tgt = randn((b, s, config.d_model), seed + 1), randn((b, t, config.d_model), seed + 2)
    with torch_context(fastpath):
        want = theirs(to_torch_layout(src, batch_first), to_torch_layout(tgt, batch_first),
                      src_mask=src_masks.torch_attn, tgt_mask=tgt_masks.torch_attn, memory_mask=memory_masks.torch_attn,
                      src_key_padding_mask=src_masks.torch_padding, tgt_key_padding_mask=tgt_masks.torch_padding,
                      memory_key_padding_mask=memory_masks.torch_padding)
    got = ours(src, tgt, src_masks.attn, tgt_masks.attn, memory_masks.attn, src_masks.padding, tgt_masks.padding,
               memory_masks.padding, src_masks.is_causal, tgt_masks.is_causal, memory_masks.is_causal)
    assert_close(got, from_torch_layout(want, batch_first))


@given(config=stack_configs(), b=st.integers(1, 3), s=st.integers(1, 5), t=st.integers(1, 5),
       batch_first=st.booleans(), final_norms=st.booleans(), seed=seeds())
def test_to_torch_round_trip(config: StackConfig, b: int, s: int, t: int, batch_first: bool, final_norms: bool,
                             seed: int) -> None:
    """``to_torch`` gives an equal nn.Transformer; ``from_torch(to_torch(m))`` has the same parameters."""
    ours = config.ours(final_norms=final_norms)
    randomize_parameters(ours, seed).eval()
    theirs = to_torch(ours, batch_first=batch_first)
    assert not theirs.training
    src, tgt = randn((b, s, config.d_model), seed + 1), randn((b, t, config.d_model), seed + 2)
    causal = ~bottom_right_causal(t, t)
    with mha_fastpath(False):
        want = theirs(to_torch_layout(src, batch_first), to_torch_layout(tgt, batch_first), tgt_mask=causal)
    assert_close(ours(src, tgt, tgt_is_causal=True), from_torch_layout(want, batch_first))
    back = from_torch(theirs)
    assert back.state_dict().keys() == ours.state_dict().keys()
    for name, value in ours.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name


# ----------------------------------------------------------------------------------------------------
# b. Causality and padding
# ----------------------------------------------------------------------------------------------------


@given(config=stack_configs(even_head_dim=True), rotary=st.booleans(), backend=st.sampled_from(BACKENDS),
       b=st.integers(1, 3), s=st.integers(1, 5), t=st.integers(2, 6), data=st.data(), seed=seeds())
def test_decoder_is_causal_by_perturbation(config: StackConfig, rotary: bool, backend: Backend, b: int, s: int,
                                           t: int, data: st.DataObject, seed: int) -> None:
    """Changing target positions >= j changes no output before j (with or without a target padding mask)."""
    j = data.draw(st.integers(1, t - 1), label="j")
    padding = data.draw(st.none() | key_padding_masks(b, t), label="tgt_padding")
    model = config.ours(rotary=rotary, backend=backend)
    randomize_parameters(model, seed).eval()
    src, tgt = randn((b, s, config.d_model), seed + 1), randn((b, t, config.d_model), seed + 2)
    changed = tgt.clone()
    changed[:, j:] = randn((b, t - j, config.d_model), seed + 3)
    out = model(src, tgt, tgt_key_padding_mask=padding, tgt_is_causal=True)
    out_changed = model(src, changed, tgt_key_padding_mask=padding, tgt_is_causal=True)
    assert_close(out_changed[:, :j], out[:, :j], EXACTISH)


@given(config=stack_configs(even_head_dim=True), rotary=st.booleans(), b=st.integers(1, 2), s=st.integers(1, 4),
       t=st.integers(1, 5), data=st.data(), seed=seeds())
def test_decoder_is_causal_by_gradient(config: StackConfig, rotary: bool, b: int, s: int, t: int,
                                       data: st.DataObject, seed: int) -> None:
    """The gradient of output position i reaches target positions <= i only (and position i itself)."""
    i = data.draw(st.integers(0, t - 1), label="i")
    model = config.ours(rotary=rotary)
    randomize_parameters(model, seed).eval()
    src = randn((b, s, config.d_model), seed + 1)
    tgt = randn((b, t, config.d_model), seed + 2).requires_grad_(True)
    model(src, tgt, tgt_is_causal=True)[:, i].sum().backward()  # type: ignore[no-untyped-call]  # torch's
    assert tgt.grad is not None
    assert torch.equal(tgt.grad[:, i + 1:], torch.zeros_like(tgt.grad[:, i + 1:]))
    assert tgt.grad[:, i].abs().sum() > 0


@given(config=stack_configs(), b=st.integers(1, 3), s=st.integers(2, 6), t=st.integers(1, 4), data=st.data(),
       seed=seeds())
def test_padded_source_positions_change_no_target_output(config: StackConfig, b: int, s: int, t: int,
                                                         data: st.DataObject, seed: int) -> None:
    padding = data.draw(key_padding_masks(b, s), label="src_padding")
    assume(not bool(padding.all()))
    model = config.ours()
    randomize_parameters(model, seed).eval()
    src, tgt = randn((b, s, config.d_model), seed + 1), randn((b, t, config.d_model), seed + 2)
    changed = torch.where(padding[..., None], src, randn((b, s, config.d_model), seed + 3) * 10)
    out = model(src, tgt, src_key_padding_mask=padding, memory_key_padding_mask=padding, tgt_is_causal=True)
    out_changed = model(changed, tgt, src_key_padding_mask=padding, memory_key_padding_mask=padding,
                        tgt_is_causal=True)
    assert_close(out_changed, out, EXACTISH)


@st.composite
def seq2seq_models(draw: st.DrawFn, *, max_layers: int = 2, head_dims: tuple[int, ...] = (2, 4)
                   ) -> Seq2SeqTransformer:
    """Tiny Seq2SeqTransformers with random weights (float64, eval), pad id 0 on both sides."""
    nhead = draw(st.integers(1, 2), label="nhead")
    head_dim = draw(st.sampled_from(head_dims), label="head_dim")
    model = Seq2SeqTransformer(
        draw(st.integers(3, 8), label="src_vocab_size"), draw(st.integers(4, 8), label="tgt_vocab_size"), 0, 0,
        d_model=nhead * head_dim, nhead=nhead, num_encoder_layers=draw(st.integers(1, max_layers), label="enc"),
        num_decoder_layers=draw(st.integers(1, max_layers), label="dec"),
        dim_feedforward=draw(st.integers(1, 6), label="dim_feedforward"), dropout=0.0,
        norm_first=draw(st.booleans(), label="norm_first"),
        positional=draw(st.sampled_from(POSITIONS), label="positional"),
        max_length=16, dtype=torch.float64)
    # Weights N(0, 0.5^2) but biases N(0, 0.1^2): with large random biases, every sequence decodes to the
    # same repeated token whatever the source, and the decoding properties would be tested on nothing.
    generator = torch.Generator().manual_seed(draw(seeds(), label="param_seed"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            std = 0.1 if name.endswith("bias") else 0.5
            param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float64) * std)
    return model.eval()


@st.composite
def token_batches(draw: st.DrawFn, vocab_size: int, b: int, n: int, *, padded: bool = True) -> Tensor:
    """Token ids ``(b, n)`` in ``1..vocab_size-1``, right-padded with 0 (each row keeps one real token)."""
    tokens = torch.randint(1, vocab_size, (b, n), generator=torch.Generator().manual_seed(draw(seeds())))
    if padded:
        tokens = tokens.masked_fill(~draw(key_padding_masks(b, n)), 0)
    return tokens


@given(model=seq2seq_models(), b=st.integers(1, 3), s=st.integers(1, 5), t=st.integers(1, 5),
       extra=st.integers(1, 3), data=st.data())
def test_more_padding_changes_no_logit(model: Seq2SeqTransformer, b: int, s: int, t: int, extra: int,
                                       data: st.DataObject) -> None:
    """Padding a batch further (more padded source and target columns) leaves every logit as it was."""
    src = data.draw(token_batches(model.src_vocab_size, b, s), label="src")
    trg = data.draw(token_batches(model.tgt_vocab_size, b, t), label="trg")
    logits = model(src, trg)
    longer = model(F.pad(src, (0, extra), value=0), F.pad(trg, (0, extra), value=0))
    assert_close(longer[:, :t], logits, EXACTISH)


# ----------------------------------------------------------------------------------------------------
# c. Positions
# ----------------------------------------------------------------------------------------------------


@given(config=stack_configs(), b=st.integers(1, 3), s=st.integers(2, 6), use_mask=st.booleans(),
       use_padding=st.booleans(), data=st.data(), seed=seeds())
def test_encoder_without_positions_is_permutation_equivariant(config: StackConfig, b: int, s: int, use_mask: bool,
                                                              use_padding: bool, data: st.DataObject,
                                                              seed: int) -> None:
    """Encoder(P x) = P Encoder(x), with the masks permuted alongside (a mask's rows and columns)."""
    permutation = torch.tensor(data.draw(st.permutations(list(range(s))), label="permutation"))
    mask = data.draw(keep_masks((s, s), fully_masked_rows=True), label="mask") if use_mask else None
    padding = data.draw(key_padding_masks(b, s, fully_padded_rows=True), label="padding") if use_padding else None
    encoder = config.ours().encoder
    randomize_parameters(encoder, seed).eval()
    x = randn((b, s, config.d_model), seed + 1)
    out = encoder(x, mask, padding)
    permuted = encoder(x[:, permutation], None if mask is None else mask[permutation][:, permutation],
                       None if padding is None else padding[:, permutation])
    assert_close(permuted, out[:, permutation])


# d_model >= 4: a LayerNorm over 2 features maps every vector to one of two points, so with d_model 2 the
# encoder's output can ignore the positions exactly.
@given(model=seq2seq_models(head_dims=(4,)), b=st.integers(1, 2), s=st.integers(2, 6), data=st.data())
@fewer_examples(2)
def test_positions_break_permutation_equivariance(model: Seq2SeqTransformer, b: int, s: int,
                                                  data: st.DataObject) -> None:
    """The same check through Seq2SeqTransformer.encode: equivariant with positional='none' only."""
    src = data.draw(token_batches(model.src_vocab_size, b, s, padded=False), label="src")
    permutation = torch.tensor(data.draw(st.permutations(list(range(s))), label="permutation"))
    assume(not torch.equal(src[:, permutation], src))
    difference = (model.encode(src[:, permutation]) - model.encode(src)[:, permutation]).abs().max().item()
    if model.positional == "none":
        assert difference < 1e-10
    else:
        assert difference > 1e-6


@given(d_model=st.integers(1, 10), t=st.integers(1, 4), offset=st.integers(0, 10_000))
def test_sinusoidal_encoding_is_the_papers_formula(d_model: int, t: int, offset: int) -> None:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    table = SinusoidalPositionalEncoding(d_model)(torch.zeros(1, t, d_model, dtype=torch.float64), offset)[0]
    want = torch.zeros(t, d_model, dtype=torch.float64)
    for j in range(t):
        for k in range(d_model):
            angle = (offset + j) / 10000 ** (2 * (k // 2) / d_model)
            want[j, k] = math.sin(angle) if k % 2 == 0 else math.cos(angle)
    assert_close(table, want, EXACTISH)


@given(half=st.integers(1, 4), m=st.integers(0, 500), n=st.integers(0, 500), shift=st.integers(0, 500),
       seed=seeds())
def test_rope_preserves_norms_and_logits_depend_only_on_the_offset(half: int, m: int, n: int, shift: int,
                                                                    seed: int) -> None:
    """|R_m q| = |q|, and (R_m q).(R_n k) = (R_{m+c} q).(R_{n+c} k) for any shift c."""
    rope = RotaryEmbedding(2 * half)
    q, k = randn((2, 3, 1, 2 * half), seed), randn((2, 3, 1, 2 * half), seed + 1)
    assert_close(rope(q, m).norm(dim=-1), q.norm(dim=-1), EXACTISH)
    logits = (rope(q, m) * rope(k, n)).sum(dim=-1)
    shifted = (rope(q, m + shift) * rope(k, n + shift)).sum(dim=-1)
    assert_close(shifted, logits, {"atol": 1e-9, "rtol": 1e-9})


# ----------------------------------------------------------------------------------------------------
# d. Decoding
# ----------------------------------------------------------------------------------------------------


def rerun_greedy(model: Seq2SeqTransformer, src: Tensor, bos: int, eos: int, max_new_tokens: int) -> Tensor:
    """Greedy decoding by re-running the whole model (encoder included) on the prefix at every step."""
    tokens = torch.full((src.shape[0], 1), bos)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_new_tokens):
        if done.all():
            break
        logits = model(src, tokens)[:, -1]
        logits[:, model.tgt_pad_idx] = float("-inf")
        next_token = logits.argmax(dim=-1).masked_fill(done, model.tgt_pad_idx)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        done |= next_token == eos
    return tokens


@given(model=seq2seq_models(), b=st.integers(1, 3), s=st.integers(1, 5), max_new_tokens=st.integers(0, 5),
       data=st.data())
@fewer_examples(2)
def test_greedy_decoding_with_cached_memory_equals_rerunning_the_model(model: Seq2SeqTransformer, b: int, s: int,
                                                                      max_new_tokens: int,
                                                                      data: st.DataObject) -> None:
    src = data.draw(token_batches(model.src_vocab_size, b, s), label="src")
    # An end token that some sequence produces first, so that sequences finish at different steps.
    first_tokens = model.greedy_decode(src, bos_idx=1, eos_idx=1, max_new_tokens=1)[:, 1].tolist()
    eos = data.draw(st.sampled_from(first_tokens) | st.integers(1, model.tgt_vocab_size - 1), label="eos")
    out = model.greedy_decode(src, bos_idx=1, eos_idx=eos, max_new_tokens=max_new_tokens)
    assert torch.equal(out, rerun_greedy(model, src, 1, eos, max_new_tokens))
    # Decoding each sequence alone gives the same tokens: padding in the batch does not matter.
    for row in range(b):
        alone = model.greedy_decode(src[row:row + 1], bos_idx=1, eos_idx=eos, max_new_tokens=max_new_tokens)[0]
        assert torch.equal(out[row, : alone.shape[0]], alone)
        assert bool((out[row, alone.shape[0]:] == 0).all())


@given(model=seq2seq_models(max_layers=1), b=st.integers(1, 2), s=st.integers(1, 4), beam_size=st.integers(1, 3),
       max_new_tokens=st.integers(1, 4), data=st.data())
@fewer_examples(2)
def test_beam_search_scores_are_log_probabilities_and_one_beam_is_greedy(model: Seq2SeqTransformer, b: int, s: int,
                                                                         beam_size: int, max_new_tokens: int,
                                                                         data: st.DataObject) -> None:
    src = data.draw(token_batches(model.src_vocab_size, b, s), label="src")
    eos = data.draw(st.integers(1, model.tgt_vocab_size - 1), label="eos")
    tokens, scores = model.beam_search(src, bos_idx=1, eos_idx=eos, max_new_tokens=max_new_tokens,
                                       beam_size=beam_size)
    log_probs = model(src, tokens[:, :-1]).log_softmax(dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]
    assert_close(scores, log_probs.masked_fill(tokens[:, 1:] == 0, 0.0).sum(dim=-1))
    for row in tokens.tolist():  # bos, then real tokens up to the first eos, then padding only
        end = row.index(eos, 1) + 1 if eos in row[1:] else len(row)
        assert 0 not in row[:end]
        assert all(token == 0 for token in row[end:])
    greedy = model.greedy_decode(src, bos_idx=1, eos_idx=eos, max_new_tokens=max_new_tokens)
    if beam_size == 1:
        assert torch.equal(tokens, greedy)


@given(model=seq2seq_models(max_layers=1), s=st.integers(1, 4), data=st.data())
@fewer_examples(2)
def test_beam_search_as_wide_as_the_vocabulary_finds_the_best_two_token_sequence(model: Seq2SeqTransformer, s: int,
                                                                                  data: st.DataObject) -> None:
    """With every first token kept (beam_size = vocabulary minus padding), two steps of beam search find the
    best of all sequences of at most two tokens, enumerated by brute force."""
    src = data.draw(token_batches(model.src_vocab_size, 1, s), label="src")
    eos = data.draw(st.integers(1, model.tgt_vocab_size - 1), label="eos")
    _, score = model.beam_search(src, bos_idx=1, eos_idx=eos, max_new_tokens=2, beam_size=model.tgt_vocab_size - 1)
    first = model(src, torch.tensor([[1]])).log_softmax(dim=-1)[0, -1]
    best = float("-inf")
    for a in range(1, model.tgt_vocab_size):
        if a == eos:
            best = max(best, first[a].item())
            continue
        second = model(src, torch.tensor([[1, a]])).log_softmax(dim=-1)[0, -1]
        best = max(best, first[a].item() + second[1:].max().item())
    assert_close(score, torch.tensor([best], dtype=torch.float64))


# ----------------------------------------------------------------------------------------------------
# e. Shape errors
# ----------------------------------------------------------------------------------------------------


@given(config=stack_configs(), b=st.integers(1, 3), s=st.integers(1, 4), t=st.integers(1, 4),
       width=st.integers(1, 13), wrong=st.sampled_from(["src", "tgt"]))
def test_a_wrong_width_is_a_shape_error_naming_argument_and_axis(config: StackConfig, b: int, s: int, t: int,
                                                                 width: int, wrong: str) -> None:
    assume(width != config.d_model)
    model = config.ours()
    src = randn((b, s, width if wrong == "src" else config.d_model), 0)
    tgt = randn((b, t, width if wrong == "tgt" else config.d_model), 1)
    with pytest.raises(ShapeError) as info:
        model(src, tgt)
    assert (info.value.argument, info.value.axis) == (wrong, "d_model")
    assert (info.value.actual, info.value.expected) == (width, config.d_model)
