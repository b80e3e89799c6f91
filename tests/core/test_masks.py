"""Conversions between torch's mask convention and ours."""

import pytest
import torch

from typed_transformer import (
    ShapeError,
    attn_mask_from_torch,
    attn_mask_to_torch,
    causal_mask,
    key_padding_mask_from_torch,
    key_padding_mask_to_torch,
    merge_causal,
    merge_masks,
)


def test_bool_masks_are_inverted_and_3d_masks_are_batch_major() -> None:
    b, h, t, s = 2, 3, 4, 5
    torch_mask = torch.rand(b * h, t, s, generator=torch.Generator().manual_seed(0)) > 0.5  # True = masked out
    ours = attn_mask_from_torch(torch_mask, num_heads=h)
    assert ours.shape == (b, h, t, s)
    for n in range(b):
        for i in range(h):
            assert torch.equal(ours[n, i], ~torch_mask[n * h + i])
    assert torch.equal(attn_mask_to_torch(ours), torch_mask)


def test_float_masks_pass_through() -> None:
    bias = torch.randn(4, 5)
    assert torch.equal(attn_mask_from_torch(bias, num_heads=2), bias)
    assert torch.equal(attn_mask_to_torch(bias), bias)


def test_a_2d_mask_needs_no_num_heads_and_a_3d_one_says_it_does() -> None:
    torch_mask = torch.rand(3, 4) > 0.5
    assert torch.equal(attn_mask_from_torch(torch_mask), ~torch_mask)
    with pytest.raises(TypeError, match=r"a 3-D mask \(\(b h\), t, s\) needs num_heads"):
        attn_mask_from_torch(torch.zeros(4, 3, 4, dtype=torch.bool))

def test_key_padding_masks_are_inverted() -> None:
    padding = torch.tensor([[False, False, True]])  # torch: True = padding
    assert key_padding_mask_from_torch(padding).tolist() == [[True, True, False]]
    assert torch.equal(key_padding_mask_to_torch(key_padding_mask_from_torch(padding)), padding)


def test_merge_masks() -> None:
    keep = torch.tensor([[True, True, False]])  # (b=1, s=3), True = real token
    alone = merge_masks(None, keep)
    assert alone is not None
    assert alone.tolist() == [[[[True, True, False]]]]
    attn = torch.tensor([[True, False, True], [True, True, True]]).reshape(1, 1, 2, 3)
    both = merge_masks(attn, keep)
    assert both is not None
    assert both.tolist() == [[[[True, False, False], [True, True, False]]]]
    bias = torch.zeros(1, 1, 2, 3)
    merged = merge_masks(bias, keep)
    assert merged is not None
    assert merged[0, 0, :, 2].tolist() == [float("-inf")] * 2
    assert merge_masks(attn, None) is attn


def test_a_3d_torch_mask_must_have_whole_heads() -> None:
    with pytest.raises(ShapeError) as info:
        attn_mask_from_torch(torch.zeros(5, 2, 3, dtype=torch.bool), num_heads=2)
    assert info.value.summary == ("typed_transformer.masks.attn_mask_from_torch(): attn_mask: axis 0 is 5, not a "
                                  "multiple of num_heads=2 (torch lays 3-D masks out as ((b h), t, s))")


@pytest.mark.parametrize(("t", "s"), [(-1, 3), (3, -1), (-2, -2)])
def test_causal_mask_refuses_negative_sizes(t: int, s: int) -> None:
    with pytest.raises(ValueError, match=f"sizes must be non-negative, got t={t}, s={s}"):
        causal_mask(t, s)


def test_causal_mask_with_no_keys_or_no_queries() -> None:
    assert causal_mask(3, 0).shape == (3, 0)
    assert causal_mask(0, 2).shape == (0, 2)


def _bottom_right(t: int, s: int) -> torch.Tensor:
    """Independent reference: query i may see key j iff j <= i + (s - t), written as a loop."""
    return torch.tensor([[j <= i + (s - t) for j in range(s)] for i in range(t)], dtype=torch.bool)


@pytest.mark.parametrize(("t", "s"), [(3, 3), (2, 5), (5, 2), (1, 4)])
def test_merge_causal_alone_is_the_bottom_right_causal_mask(t: int, s: int) -> None:
    assert torch.equal(merge_causal(None, t, s), _bottom_right(t, s))


def test_merge_causal_ands_boolean_masks_and_broadcasts() -> None:
    t, s = 3, 5
    keep = torch.rand(2, 1, 1, s, generator=torch.Generator().manual_seed(1)) > 0.3
    merged = merge_causal(keep, t, s)
    assert merged.shape == (2, 1, t, s)
    assert torch.equal(merged, keep & _bottom_right(t, s))


def test_merge_causal_puts_minus_infinity_into_float_masks() -> None:
    t, s = 4, 4
    bias = torch.randn(t, s, generator=torch.Generator().manual_seed(2))
    merged = merge_causal(bias, t, s)
    allowed = _bottom_right(t, s)
    assert torch.equal(merged[allowed], bias[allowed])
    assert bool(torch.all(merged[~allowed] == float("-inf")))


@pytest.mark.parametrize(("shape", "axis", "actual", "expected"), [((3, 4), "s", 4, 5), ((1, 1, 2, 5), "t", 2, 3)])
def test_merge_causal_refuses_a_mask_of_other_sizes(shape: tuple[int, ...], axis: str, actual: int,
                                                     expected: int) -> None:
    with pytest.raises(ShapeError) as info:
        merge_causal(torch.ones(shape, dtype=torch.bool), 3, 5)
    assert info.value.summary == (f"typed_transformer.masks.merge_causal(): attn_mask: axis {axis} is {actual}, "
                                  f"expected {expected} (the argument {axis})")
    assert (info.value.axis, info.value.actual, info.value.expected) == (axis, actual, expected)


def test_merge_causal_refuses_negative_sizes() -> None:
    with pytest.raises(ValueError, match=r"^causal_mask: sizes must be non-negative, got t=-1, s=2$"):
        merge_causal(None, -1, 2)


@pytest.mark.parametrize(("t", "s", "window"), [(5, 5, 2), (2, 6, 3), (6, 4, 2), (1, 9, 4), (4, 4, 10)])
def test_window_mask_is_the_bottom_right_sliding_window_edge(t: int, s: int, window: int) -> None:
    from typed_transformer.masks import window_mask

    expected = [[j > (i + s - t) - window for j in range(s)] for i in range(t)]
    assert window_mask(t, s, window).tolist() == expected
    # with the causal mask: each query sees itself and the window - 1 keys before it (Mistral's sliding window)
    both = window_mask(t, s, window) & causal_mask(t, s)
    assert both.tolist() == [[(i + s - t) - window < j <= i + s - t for j in range(s)] for i in range(t)]


def test_window_mask_refuses_an_empty_window() -> None:
    from typed_transformer.masks import window_mask

    with pytest.raises(ValueError, match="window positive"):
        window_mask(3, 3, 0)
