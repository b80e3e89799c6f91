"""The public Hypothesis strategies: every draw satisfies the constraints its docstring promises."""

import subprocess
import sys

import hypothesis
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from typed_transformer import MultiHeadAttention
from typed_transformer.strategies import (
    MASK_LAYOUTS,
    MAX_SEED,
    TORCH_RANDOM,
    AttentionInputs,
    AttentionShape,
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

FAST = settings(max_examples=40, deadline=None, derandomize=True, database=None)


def test_import_typed_transformer_does_not_import_hypothesis() -> None:
    code = "import sys, typed_transformer; print('hypothesis' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_torch_rng_is_registered_with_hypothesis() -> None:
    from hypothesis.internal.entropy import RANDOMS_TO_MANAGE

    assert any(managed is TORCH_RANDOM for managed in RANDOMS_TO_MANAGE.values())


def test_global_torch_rng_replays_per_example() -> None:
    seen: list[float] = []

    @settings(max_examples=3, derandomize=True, database=None, deadline=None)
    @given(st.just(0))
    def record(_: int) -> None:
        seen.append(float(torch.rand(())))

    record()
    first = list(seen)
    seen.clear()
    record()
    assert seen == first


@FAST
@given(seed=seeds())
def test_seeds_are_valid_generator_seeds(seed: int) -> None:
    assert 0 <= seed <= MAX_SEED
    assert randn((2, 3), seed).equal(randn((2, 3), seed))


def test_randn_is_a_pure_function_of_the_seed() -> None:
    state = torch.random.get_rng_state()
    a = randn((4,), 7, dtype=torch.float32)
    assert torch.random.get_rng_state().equal(state)
    assert a.dtype == torch.float32
    assert a.equal(randn((4,), 7, dtype=torch.float32))
    assert not a.equal(randn((4,), 8, dtype=torch.float32))


@FAST
@given(dtype=float_dtypes(half=False))
def test_float_dtypes_without_half(dtype: torch.dtype) -> None:
    assert dtype in (torch.float64, torch.float32)


@FAST
@given(shape=attention_shapes())
def test_attention_shapes_respect_the_documented_ranges(shape: AttentionShape) -> None:
    assert 1 <= shape.b <= 3
    assert 1 <= shape.t <= 7
    assert 1 <= shape.s <= 7
    assert 1 <= shape.g <= 3
    assert 1 <= shape.r <= 3
    assert 1 <= shape.d <= 8
    assert 1 <= shape.dv <= 8
    assert shape.h % shape.g == 0
    assert shape.h == shape.g * shape.r
    assert shape.q == (shape.b, shape.h, shape.t, shape.d)
    assert shape.k == (shape.b, shape.g, shape.s, shape.d)
    assert shape.v == (shape.b, shape.g, shape.s, shape.dv)
    assert shape.out == (shape.b, shape.h, shape.t, shape.dv)
    assert shape.weights == (shape.b, shape.h, shape.t, shape.s)


@FAST
@given(shape=attention_shapes(same_length=True, max_group=1, min_len=2, max_len=4))
def test_attention_shapes_options(shape: AttentionShape) -> None:
    assert shape.t == shape.s
    assert 2 <= shape.t <= 4
    assert shape.h == shape.g


@FAST
@given(inputs=attention_inputs(dtype=torch.float32))
def test_attention_inputs_are_a_function_of_the_seed(inputs: AttentionInputs) -> None:
    shape = inputs.shape
    assert inputs.q.shape == shape.q
    assert inputs.k.shape == shape.k
    assert inputs.v.shape == shape.v
    assert inputs.q.dtype == inputs.k.dtype == inputs.v.dtype == torch.float32
    generator = torch.Generator().manual_seed(inputs.seed)
    assert inputs.q.equal(torch.randn(shape.q, generator=generator, dtype=torch.float32))


@FAST
@given(mask=keep_masks((3, 4, 6)))
def test_keep_masks_keep_a_key_in_every_row(mask: torch.Tensor) -> None:
    assert mask.dtype == torch.bool
    assert mask.shape == (3, 4, 6)
    assert mask.any(dim=-1).all()


def test_keep_masks_can_mask_whole_rows() -> None:
    found: list[bool] = []

    @FAST
    @given(mask=keep_masks((2, 3), fully_masked_rows=True, always_keep=None))
    def collect(mask: torch.Tensor) -> None:
        found.append(bool((~mask.any(dim=-1)).any()))

    collect()
    assert any(found)


@FAST
@given(mask=keep_masks((2, 5, 4), fully_masked_rows=True, always_keep=2))
def test_keep_masks_always_keep(mask: torch.Tensor) -> None:
    assert mask[..., 2].all()


@FAST
@given(bias=additive_masks((2, 1, 4, 6), dtype=torch.float32))
def test_additive_masks_leave_a_finite_entry_per_row(bias: torch.Tensor) -> None:
    assert bias.dtype == torch.float32
    assert bias.shape == (2, 1, 4, 6)
    assert (bias > float("-inf")).any(dim=-1).all()
    assert not bias.isnan().any()


@FAST
@given(bias=additive_masks((3, 5), neg_inf=False))
def test_additive_masks_without_neg_inf_are_finite(bias: torch.Tensor) -> None:
    assert bias.isfinite().all()


@FAST
@given(data=st.data(), shape=attention_shapes())
def test_attn_masks_have_a_documented_layout(data: st.DataObject, shape: AttentionShape) -> None:
    mask = data.draw(attn_masks(shape))
    assert mask.shape in [mask_shape(layout, shape) for layout in MASK_LAYOUTS]
    keep = mask if mask.dtype == torch.bool else mask > float("-inf")
    assert keep.any(dim=-1).all()


def test_mask_shape() -> None:
    shape = AttentionShape(b=2, t=3, s=4, g=1, r=5, d=1, dv=1)
    assert mask_shape("b 1 t s", shape) == (2, 1, 3, 4)
    assert mask_shape("1 h t s", shape) == (1, 5, 3, 4)
    assert mask_shape("t s", shape) == (3, 4)


@FAST
@given(padding=key_padding_masks(3, 5))
def test_key_padding_masks_keep_a_real_token_per_row(padding: torch.Tensor) -> None:
    assert padding.shape == (3, 5)
    assert padding.dtype == torch.bool
    assert padding.any(dim=-1).all()


@FAST
@given(config=mha_configs())
def test_mha_configs_build_modules(config: MHAConfig) -> None:
    assert config.num_heads % config.num_kv_heads == 0
    module = MultiHeadAttention(config.d_model, config.num_heads, **config.kwargs())
    assert module.num_heads == config.num_heads
    assert module.num_kv_heads == config.num_kv_heads
    assert module.extra_keys == config.extra_keys
    assert module.kdim == config.key_width
    assert module.vdim == config.value_width


@FAST
@given(config=mha_configs(torch_compatible=True, even_heads=True))
def test_mha_configs_torch_compatible(config: MHAConfig) -> None:
    assert config.num_kv_heads == config.num_heads
    assert config.input_dim is None
    assert config.num_heads % 2 == 0
    torch.nn.MultiheadAttention(config.d_model, config.num_heads, batch_first=True, **config.torch_kwargs())


def test_mha_configs_reach_every_constructor_option() -> None:
    seen: set[str] = set()

    @settings(max_examples=150, deadline=None, derandomize=True, database=None)
    @given(config=mha_configs(dropouts=(0.0, 0.1), backends=("sdpa", "reference"), rotary=True))
    def collect(config: MHAConfig) -> None:
        module = MultiHeadAttention(config.d_model, config.num_heads, **config.kwargs())
        flags = {"gqa": config.num_kv_heads != config.num_heads, "input_dim": config.input_dim is not None,
                 "kdim": config.kdim is not None, "no_bias": not config.bias, "bias_kv": config.add_bias_kv,
                 "zero_attn": config.add_zero_attn, "dropout": module.dropout > 0,
                 "reference": module.backend == "reference", "rotary": module.rotary is not None}
        seen.update(name for name, on in flags.items() if on)
        if config.rotary:
            assert config.head_dim % 2 == 0
            assert config.kdim is None
            assert config.vdim is None

    collect()
    assert seen == {"gqa", "input_dim", "kdim", "no_bias", "bias_kv", "zero_attn", "dropout", "reference", "rotary"}


def test_mha_config_torch_kwargs_refuses_what_torch_cannot_express() -> None:
    with pytest.raises(ValueError, match="cannot express"):
        MHAConfig(num_heads=2, head_dim=2, num_kv_heads=1).torch_kwargs()


def test_randomize_parameters_is_seeded_and_sets_biases() -> None:
    a = randomize_parameters(MultiHeadAttention(4, 2), seed=3)
    b = randomize_parameters(MultiHeadAttention(4, 2), seed=3)
    assert a.out_proj.bias is not None
    assert bool(a.out_proj.bias.abs().sum() > 0)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert pa.equal(pb)


def test_hypothesis_is_recent_enough() -> None:
    major, minor = (int(x) for x in hypothesis.__version__.split(".")[:2])
    assert (major, minor) >= (6, 150)


# --- narrowing options used by the audit's declarations (issue 10) -----------------------------------------


@given(shape=attention_shapes(min_head_dim=3, max_head_dim=8, head_dim_multiple=2, same_value_dim=True))
def test_attention_shapes_narrowed_head_sizes(shape: AttentionShape) -> None:
    assert shape.d in (4, 6, 8)
    assert shape.dv == shape.d


@given(padding=key_padding_masks(3, 5, styles=["right"]))
def test_key_padding_masks_right_padding_only(padding: torch.Tensor) -> None:
    lengths = padding.sum(dim=-1)
    assert torch.equal(padding, torch.arange(5) < lengths[:, None])
    assert bool((lengths >= 1).all())
